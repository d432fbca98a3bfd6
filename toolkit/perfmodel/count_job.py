"""A job's model as the performance model sees it: the built-in transformers by their shape,
any other model by its counted costs (toolkit.perfmodel.counted on meta tensors, on an
example micro-batch of the job's own data). Imports torch and your package only to count a
model that is not a built-in transformer (the report of a built-in model's run stays torch-
free); the CLIs and the report call it, the pure model (toolkit.perfmodel.model) never does."""

from __future__ import annotations

from typing import Any

from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig, display_name, vocab_size
from toolkit.perfmodel.counted_model import CountedShape

EXAMPLE_SAMPLES = 2


def perf_model(job: JobConfig) -> TransformerConfig | CountedShape:
    """What toolkit.perfmodel.predict takes for this job's model."""
    return counted_shape_or_none(job) or job.model


def counted_shape_or_none(job: JobConfig) -> CountedShape | None:
    """What predict_job's `counted` takes: None for a built-in transformer (its analytic
    terms), else the model's counted costs."""
    if isinstance(job.model, TransformerConfig):
        return None
    return counted_shape(job)


def counted_shape(job: JobConfig) -> CountedShape:
    """Count the job's model once on an example micro-batch of its data (no real memory
    for the model; the batch's values do not matter, only its shapes)."""
    import torch

    from toolkit.perfmodel.counted import count
    from toolkit.train.models.registry import spec_config, spec_for

    spec = spec_for(job.model)
    cfg = spec_config(job.model)
    with torch.device("meta"):
        model = spec.build(cfg)
    units = max(1, len(spec.units_of(model)))
    tokens = job.data.seq_len if spec.unit == "tokens" else 0
    name = display_name(job.model)
    if spec.flops_per_sample is not None:  # the spec's own FLOPs: no run needed
        flops = spec.flops_per_sample(cfg, job.data.seq_len)
        params = sum(p.numel() for p in dict(model.named_parameters()).values())
        # The spec's own saved activations; without them the memory estimate is a floor.
        saved = spec.saved_bytes_per_sample
        activations = 0.0 if saved is None else saved(cfg, job.data.seq_len)
        return CountedShape(name, flops, flops / 3, params, activations, units, tokens)
    cost = count(lambda: spec.build(cfg), example_batch(job), spec.loss_of)
    return CountedShape(
        name=name,
        flops_per_sample=cost.flops_per_sample,
        forward_flops_per_sample=cost.forward_flops_per_sample,
        num_params=cost.num_params,
        saved_bytes_per_sample=cost.saved_bytes / cost.batch_size,
        units=units,
        tokens_per_sample=tokens,
    )


def example_batch(job: JobConfig) -> Any:
    """A micro-batch of EXAMPLE_SAMPLES samples shaped as the job's data gives them: token
    windows, the market dataset's windows, or your Dataset's own items through its collate."""
    import torch

    from toolkit.config.data import DatasetConfig

    data = job.data
    if isinstance(data, DatasetConfig):
        return dataset_batch(data)
    if data.kind == "returns":
        from toolkit.config.model import series_shape
        from toolkit.data.training import open_dataset

        opened = open_dataset(data, *series_shape(job.model))
        x = torch.zeros(EXAMPLE_SAMPLES, data.seq_len, opened.num_inputs)
        return x, torch.zeros(EXAMPLE_SAMPLES, opened.num_targets)
    vocab = vocab_size(job.model) or 256
    tokens = torch.randint(0, vocab, (EXAMPLE_SAMPLES, data.seq_len))
    return tokens, tokens


def dataset_batch(data: Any) -> Any:
    from hydra.utils import instantiate
    from torch.utils.data import IterableDataset, default_collate

    from toolkit.train.targets import locate

    dataset = instantiate({"_target_": data.target, **data.kwargs}, _convert_="all")
    if isinstance(dataset, IterableDataset):
        stream = iter(dataset)
        items = [next(stream) for _ in range(EXAMPLE_SAMPLES)]
    else:
        items = [dataset[i] for i in range(EXAMPLE_SAMPLES)]
    collate = locate(data.collate_fn)[0] if data.collate_fn else default_collate
    return collate(items)
