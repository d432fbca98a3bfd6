"""`python -m toolkit.perfmodel.counted [-cd DIR] [--batch N] [--seq S] [--time R] MODEL...`:
count each model's FLOPs, parameters and saved activations on meta tensors and print them.

MODEL is a model option of the config (`gpt_125m`, `hf_llama_tiny`, your own
`model/NAME.yaml` in a `-cd` directory; a model that reads tokens gets a batch of `--batch`
sequences of `--seq` tokens), or `module:function` naming a function of yours that returns a
toolkit.perfmodel.counted.Workload (any model, any batch).

`--time R` is the benchmark: R interleaved repetitions of counting (meta) and, as the
baseline beside it, one real forward + backward of the same batch on the CPU; it prints the
medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from toolkit.config.compose import job_or_none
from toolkit.config.sources import add_config_dir_option
from toolkit.errors import UserError
from toolkit.perfmodel.counted import Workload
from toolkit.train.models import registry
from toolkit.train.models.target import import_path


def preset_workload(name: str, batch: int, seq: int, config_dirs: list[str]) -> Workload:
    """The workload of model option `name`: its spec's builder and loss on token batches."""
    job = job_or_none([f"model={name}", f"data.seq_len={seq}"], config_dirs)
    if job is None:
        raise UserError(f"{name}: not a model option (errors above)")
    spec = registry.spec_for(job.model)
    reads = type(job.model).SUPPORTS.reads
    if reads != "tokens":
        raise UserError(
            f"{name}: reads {reads}, not tokens; name a module:function of yours that returns "
            "a toolkit.perfmodel.counted.Workload with an example batch"
        )
    config = registry.spec_config(job.model)
    return Workload(
        build=lambda: spec.build(config),
        batch=lambda: (torch.zeros(batch, seq, dtype=torch.long),) * 2,
        loss=spec.loss_of,
        tokens_per_sample=seq,
    )


def workload(target: str, batch: int, seq: int, config_dirs: list[str]) -> Workload:
    if ":" not in target:
        return preset_workload(target, batch, seq, config_dirs)
    module, _, attr = target.partition(":")
    made = import_path(f"{module}.{attr}", "MODEL")
    made = made() if callable(made) else made
    if not isinstance(made, Workload):
        raise UserError(f"{target}: gives a {type(made).__name__}, not a Workload")
    return made


def real_step_s(w: Workload) -> float:
    """Seconds of one real forward + backward on the CPU (the baseline): the model built and
    initialised on the CPU, the example batch made there."""
    from toolkit.perfmodel.counted import output_loss

    torch.manual_seed(0)
    model = w.build()
    real = w.batch() if callable(w.batch) else w.batch
    start = time.perf_counter()
    (w.loss or output_loss)(model, real).backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.perfmodel.counted")
    add_config_dir_option(parser)
    parser.add_argument("--batch", type=int, default=1, help="samples in the example batch")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sample (token models)")
    parser.add_argument("--time", type=int, default=0, metavar="R", help="benchmark: R repeats")
    parser.add_argument("models", nargs="+", metavar="MODEL")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for target in args.models:
        try:
            w = workload(target, args.batch, args.seq, args.config_dir)
            cost = w.count()
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        per_token = "" if cost.flops_per_token is None else f", {cost.flops_per_token:.4g}/token"
        print(
            f"{target}: {cost.flops_per_sample:.4g} FLOPs/sample (fwd+bwd{per_token}), "
            f"{cost.num_params:,} params ({cost.param_bytes / 2**20:,.1f} MiB), "
            f"{cost.saved_bytes_per_sample / 2**20:,.2f} MiB saved/sample"
        )
        if args.time:
            counted, real = [], []
            for _ in range(args.time):  # interleaved: A, B, A, B, ...
                start = time.perf_counter()
                w.count()
                counted.append(time.perf_counter() - start)
                real.append(real_step_s(w))
            c, r = statistics.median(counted), statistics.median(real)
            print(
                f"  counting {c:.3f} s (median of {args.time}); real CPU forward+backward "
                f"{r:.3f} s; counting/real = {c / r:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
