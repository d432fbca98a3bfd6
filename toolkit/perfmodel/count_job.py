"""A job's model as the performance model sees it: the built-in transformers by their shape,
any other model by its counted costs (toolkit.perfmodel.counted on meta tensors, on an
example micro-batch of the job's own data). Imports torch and your package only to count a
model that is not a built-in transformer. A run counts its own model once and records it as
RUN/model.json (record_run_model, rank 0); the readers of a run directory (report, status,
perfmodel/plan --run) take that plain data (shape_of_run_model) and never call the counting
here, which builds and instantiates what a config names. The pure model
(toolkit.perfmodel.model) never calls it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from toolkit.config.job import JobConfig
from toolkit.config.model import TransformerConfig, display_name, vocab_size
from toolkit.perfmodel.counted_model import CountedShape
from toolkit.runmodel import RunModel, write_run_model

EXAMPLE_SAMPLES = 2
FP32_BYTES = 4  # parameters are kept in fp32 (the mixed-precision policy casts copies)


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
    for the model; the batch's values do not matter, only its shapes). For a job being
    planned or launched from your own config, never for a run directory's: a run's own
    count is its RUN/model.json (shape_of_run_model)."""
    from toolkit.train.models.registry import spec_for

    analytic = spec_for(job.model).flops_per_sample is not None  # no data needed
    return shape_of_run_model(run_model(job, None if analytic else example_batch(job)))


def run_model(job: JobConfig, batch: Any = None) -> RunModel:
    """What RUN/model.json records of the job's model: the spec's own FLOPs where it states
    them, else one forward + backward of `batch` (a micro-batch of the job's data) counted on
    meta tensors. Imports torch and builds the model: only a run or your own command line
    calls it, never a reader of a run directory."""
    import torch

    from toolkit.perfmodel.counted import count
    from toolkit.train.models.registry import spec_config, spec_for

    spec = spec_for(job.model)
    cfg = spec_config(job.model)
    with torch.device("meta"):
        model = spec.build(cfg)
    units = max(1, len(spec.units_of(model)))
    tokens = job.data.seq_len if spec.unit == "tokens" else 0
    # trainer.ensemble: K members of this model in one step; the counts are one member's.
    ensemble = max(1, job.trainer.ensemble)
    shape = input_shape(batch) if batch is not None else ([job.data.seq_len] if tokens else [])
    if spec.flops_per_sample is not None:  # the spec's own FLOPs: no counting needed
        flops = spec.flops_per_sample(cfg, job.data.seq_len)
        params = sum(p.numel() for p in dict(model.named_parameters()).values())
        # The spec's own saved activations; without them the memory estimate is a floor.
        saved = spec.saved_bytes_per_sample
        activations = 0.0 if saved is None else saved(cfg, job.data.seq_len)
        forward = flops / 3
        ops, tensors = 0, len(dict(model.named_parameters()))  # ops not counted: no floor
    else:
        cost = count(lambda: spec.build(cfg), batch, spec.loss_of)
        flops, forward = cost.flops_per_sample, cost.forward_flops_per_sample
        params, activations = cost.num_params, cost.saved_bytes / cost.batch_size
        ops, tensors = cost.ops, cost.param_tensors
    return RunModel(
        name=display_name(job.model),
        unit=spec.unit,
        flops_per_sample=float(flops),
        forward_flops_per_sample=float(forward),
        num_params=int(params),
        param_bytes=int(params) * FP32_BYTES * ensemble,
        tokens_per_sample=tokens,
        saved_bytes_per_sample=float(activations),
        units=units,
        input_shape=shape,
        ensemble=ensemble,
        ops_per_micro_step=ops,
        param_tensors=tensors,
    )


def record_run_model(job: JobConfig, run_dir: Path, batch: Any = None) -> RunModel:
    """Count the job's model (run_model) and write RUN/model.json for the run's readers."""
    model = run_model(job, batch)
    write_run_model(run_dir, model)
    return model


def shape_of_run_model(model: RunModel) -> CountedShape:
    """What the performance model takes for a model recorded in a RUN/model.json: plain
    numbers, nothing built. An ensemble of K members (recorded per member) is K times the
    arithmetic, parameters and saved activations per sample."""
    shape = CountedShape(
        **{f.name: getattr(model, f.name) for f in dataclasses.fields(CountedShape)}
    )
    k = model.ensemble
    if k == 1:
        return shape
    return dataclasses.replace(
        shape,
        flops_per_sample=k * shape.flops_per_sample,
        forward_flops_per_sample=k * shape.forward_flops_per_sample,
        num_params=k * shape.num_params,
        saved_bytes_per_sample=k * shape.saved_bytes_per_sample,
    )


def predicted_rate(
    prediction: Any, model: TransformerConfig | CountedShape, seq_len: int
) -> tuple[str, float]:
    """(unit, rate) of a prediction: tokens/s for a token model, samples/s for any other.
    A counted samples model's prediction counts one "token" per sample
    (CountedShape.tokens_per_sample == 0), the analytic time-series transformer's counts
    `seq_len` per sample."""
    if isinstance(model, TransformerConfig):
        if model.token_inputs:
            return "tokens", prediction.tokens_per_s
        return "samples", prediction.tokens_per_s / max(1, seq_len)
    if model.tokens_per_sample > 0:
        return "tokens", prediction.tokens_per_s
    return "samples", prediction.tokens_per_s


def input_shape(batch: Any) -> list[int]:
    """One sample's input shape: the first tensor of the batch without its batch dim."""
    first = batch
    while isinstance(first, tuple | list | dict) and first:
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    shape = getattr(first, "shape", None)
    return [int(d) for d in shape[1:]] if shape is not None and len(shape) > 0 else []


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
