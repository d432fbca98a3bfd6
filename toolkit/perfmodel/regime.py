"""A job in the small-model regime (toolkit.perfmodel.small) as `toolkit perfmodel` and
`toolkit plan` print it: the launch floor and one model's arithmetic, what K members packed
in one step give, each data path's rate against what the step needs, and the advice (the
term that bounds the step, the ensemble size, micro-batch and data path to use).

The data paths' measured rates come from a `toolkit bench data --json` file, read as plain
JSON (read_bench_data); everything else is arithmetic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolkit.config.job import JobConfig
from toolkit.config.model import TimeSeriesConfig
from toolkit.perfmodel import small
from toolkit.perfmodel.job import layout_from_job
from toolkit.perfmodel.layout import Layout
from toolkit.perfmodel.model import predict
from toolkit.perfmodel.prediction import device_capacity

DEVICE_PATH = small.DEVICE_PATH


@dataclass(frozen=True)
class Regime:
    split: small.StepSplit  # one model's step: floor and arithmetic
    advice: small.Advice
    rates: dict[str, float]  # samples/s per rank per data path
    samples_per_step: int  # a rank's samples per step (members share them)
    lines: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "floor_s": self.split.floor_s,
            "member_s": self.split.member_s,
            "launches": self.split.launches,
            "overhead_share": self.split.overhead_share,
            "data_rates_samples_per_s": self.rates,
            "samples_per_step_per_rank": self.samples_per_step,
            **self.advice.as_dict(),
        }


def data_rates(job: JobConfig, measured: dict[str, float]) -> dict[str, float]:
    """Samples/s per rank of each data path: those measured (`toolkit bench data`), and for
    the built-in windowed series the device-resident gather from its bytes (an estimate)."""
    rates = dict(measured)
    model, hw = job.model, job.hardware
    if isinstance(model, TimeSeriesConfig) and DEVICE_PATH not in rates and hw.num_sms > 0:
        per_sample = small.window_bytes(job.data.seq_len, model.num_series, model.num_targets)
        rate = small.device_gather_rate(per_sample, hw.memory_bandwidth, hw.elementwise_fraction)
        rates[DEVICE_PATH] = rate
    return rates


def regime(
    job: JobConfig,
    world: int | None = None,
    counted: Any = None,
    measured: dict | None = None,
    layout: Layout | None = None,
) -> Regime | None:
    """The job's step in the small-model regime (K = 1, then packed), in its own layout or
    `layout` (the planner's); None for a model whose launches are not counted (a model of
    yours: no launch floor is modelled)."""
    model = counted if counted is not None else job.model
    layout = layout_from_job(job, world, counted) if layout is None else layout
    hw = job.hardware
    one = predict(model, layout, hw)
    s = small.split(one.time)
    if s.launches <= 0:
        return None
    capacity = device_capacity(hw, layout.ranks_per_node)
    members = small.memory_ensemble(one.memory["peak_bytes"], capacity)
    balance_b = small.balance_micro_batch(
        lambda b: predict(model, replace(layout, micro_batch_size=b), hw),
        layout.micro_batch_size,
    )
    rates = data_rates(job, measured or {})
    samples = layout.micro_batch_size * layout.grad_accum
    advice = small.advise(s, layout.micro_batch_size, samples, members, balance_b, rates, one.fits)
    said = lines(job, s, advice, rates, samples, layout.dp)
    if balance_b is not None and balance_b > layout.micro_batch_size:
        at_b = predict(model, replace(layout, micro_batch_size=balance_b), hw)
        need = balance_b * layout.grad_accum / at_b.step_s
        keep_up = [name for name, rate in rates.items() if rate >= need]
        said.insert(
            -1,
            f"at micro-batch {balance_b:,}: step {small.fmt_ms(at_b.step_s)}, the step needs "
            f"{need:,.0f} samples/s per rank: "
            + (f"kept up by {', '.join(keep_up)}" if keep_up else "no data path measured keeps up"),
        )
    return Regime(s, advice, rates, samples, said)


def lines(
    job: JobConfig,
    s: small.StepSplit,
    advice: small.Advice,
    rates: dict[str, float],
    samples: int,
    dp: int,
) -> list[str]:
    """What the command lines print, one fact a line."""
    hw = job.hardware
    k = advice.ensemble
    out = [
        f"launch floor: {s.launches:,.0f} kernel launches x {hw.op_overhead_s * 1e6:.1f} us "
        f"(hardware.op_overhead_s) + FSDP2's per-unit cost = {small.fmt_ms(s.floor_s)} per "
        f"step; one model's arithmetic {small.fmt_ms(s.member_s)} "
        f"({100 * s.overhead_share:.0f} % of its step is the floor)"
    ]
    if k > 1:
        step = s.step_s(k)
        out.append(
            f"packed, trainer.ensemble={k}: step {small.fmt_ms(step)} (one floor without "
            f"FSDP2's, {k} x the arithmetic), {k * samples * dp / step:,.0f} member-samples/s, "
            f"{k * s.step_s(1) / step:.1f}x {k} separate steps"
        )
    step = s.step_s(k)
    need = samples / step
    for name, rate in sorted(rates.items(), key=lambda kv: -kv[1]):
        verdict = "keeps up" if rate >= need else "too slow"
        how = " (estimate: its bytes at the device's rate)" if name == DEVICE_PATH else ""
        out.append(
            f"data: {name}: {rate:,.0f} samples/s per rank{how}; the step needs "
            f"{need:,.0f}: {verdict}"
        )
    if not rates:
        out.append(
            "data: no rate measured (toolkit bench data --json FILE, then --bench-data FILE)"
        )
    out.append(advice.line)
    return out


def add_bench_data_option(parser: Any) -> None:
    """--bench-data FILE for `toolkit perfmodel` and `toolkit plan`."""
    parser.add_argument(
        "--bench-data",
        type=Path,
        default=None,
        metavar="FILE",
        help="data paths' samples/s: the JSON of `toolkit bench data --json FILE`",
    )


def read_bench_data(path: Path | None) -> dict[str, float]:
    """The data paths' rates in a `toolkit bench data --json` file (plain JSON, read as
    data); ValueError with one line naming the file when it is not such a result."""
    if path is None:
        return {}
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--bench-data {path}: not readable as JSON ({exc})") from None
    rates = small.bench_data_rates(result)
    if not rates:
        raise ValueError(
            f"--bench-data {path}: no samples_per_s rows; give the file "
            "`toolkit bench data --json FILE` wrote"
        )
    return rates
