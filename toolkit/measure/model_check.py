"""`python -m toolkit.measure.model_check --profile-dir DIR --profile NAME [grid options]`: the
performance model against measured step times, over a grid of configurations.

For every combination of --models x --worlds x --ac x --accum it runs the training benchmark
(`python -m toolkit.measure.run`, local ranks) with the measured hardware profile, then prints
one markdown table: measured and predicted step time (median), their ratio, the measured
split (compute / exposed communication / optimizer) beside the predicted one, and the predicted
per-term split, and how fast the machine was against the profile: before every configuration
the profile's speed probe (toolkit.measure.kernel_rates.speed_probe) runs again, and the column
"probe now / at profile" is its time now over the time recorded in the profile (1.30: the
same one-thread work took 30 % longer than when the profile was measured; on a shared VM a
ratio that far from 1 is noise the prediction cannot know). The table also goes to
OUT/model_check.md, every run's summary to OUT/model_check.json. A benchmark command, not a
test: it measures and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from toolkit.perfmodel.model import TERMS

# The step's measured parts shown beside the model's (toolkit.perfmodel.split).
SPLIT = ("compute", "exposed_communication", "optimizer")

# Per-model overrides that keep one step within seconds on a CPU (gpt_125m: its 50k
# vocabulary head dominates at sequence 64, micro-batch 2).
MODEL_OVERRIDES = {
    "gpt_tiny": ["data.seq_len=128", "trainer.micro_batch_size=8"],
    "gpt_small": ["data.seq_len=128", "trainer.micro_batch_size=8"],
    "gpt_125m": ["data.seq_len=64", "trainer.micro_batch_size=2"],
}


def grid(args: argparse.Namespace) -> list[tuple[str, int, bool, int]]:
    return [
        (model, world, ac, accum)
        for model in args.models.split(",")
        for world in (int(w) for w in args.worlds.split(","))
        for ac in (v == "true" for v in args.ac.split(","))
        for accum in (int(a) for a in args.accum.split(","))
    ]


def overrides_for(
    args: argparse.Namespace, model: str, world: int, ac: bool, accum: int
) -> list[str]:
    return [
        f"model={model}",
        *MODEL_OVERRIDES.get(model, []),
        f"cluster.tasks_per_node={world}",
        f"parallel.activation_checkpointing={str(ac).lower()}",
        f"trainer.grad_accum={accum}",
        f"hydra.searchpath=[file://{args.profile_dir.resolve()}]",
        f"hardware={args.profile.format(world=world)}",
        *args.overrides,
    ]


def row(summary: dict[str, Any], model: str, world: int, ac: bool, accum: int) -> str:
    ms = 1000.0
    drift = summary.get("probe_ratio")
    probe = "-" if drift is None else f"{drift:.2f}"
    measured, predicted = summary["step_time_s_median"], summary["predicted_step_s"]
    terms = " / ".join(f"{summary[f'predicted_{t}_s'] * ms:,.1f}" for t in TERMS)

    def split(kind: str) -> str:
        values = (summary.get(f"split_{kind}_{part}_s") for part in SPLIT)
        return " / ".join("-" if v is None else f"{v * ms:,.1f}" for v in values)

    return (
        f"| {model} | {world} | {'yes' if ac else 'no'} | {accum} "
        f"| {measured * ms:,.1f} ({summary['step_time_s_p10'] * ms:,.0f}–"
        f"{summary['step_time_s_p90'] * ms:,.0f}) | {predicted * ms:,.1f} "
        f"| {measured / predicted:.2f} | {probe} "
        f"| {split('measured')} | {split('predicted')} | {terms} |"
    )


HEADER = (
    "| model | ranks | AC | accum | measured ms median (p10–p90) | predicted ms "
    "| measured / predicted | probe now / at profile | measured "
    + " / ".join(SPLIT)
    + " ms | predicted "
    + " / ".join(SPLIT)
    + " ms | predicted "
    + " / ".join(TERMS)
    + " ms |\n|"
    + "---|" * 11
)


def probe_ratio(profile_probe_s: float) -> float | None:
    """The speed probe's time now over its time in the profile; None when the profile has
    no probe (a preset, or a profile from before the probe)."""
    if profile_probe_s <= 0:
        return None
    import torch

    from toolkit.measure.kernel_rates import speed_probe

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # as the profile
    return speed_probe(device) / profile_probe_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit.measure.model_check")
    p.add_argument("--profile-dir", type=Path, required=True, help="DIR of DIR/hardware/NAME.yaml")
    p.add_argument(
        "--profile",
        required=True,
        help="NAME of the measured profile; {world} is replaced by the run's world size "
        "(collectives are measured for one world size)",
    )
    p.add_argument("--models", default="gpt_tiny,gpt_small,gpt_125m")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--ac", default="false,true")
    p.add_argument("--accum", default="1,2")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from toolkit.config.errors import ConfigError
    from toolkit.config.hardware import load_profile
    from toolkit.measure.run import main as bench

    names = {args.profile.format(world=w) for _, w, _, _ in grid(args)}
    profiles = {}
    try:  # every profile complete and valid before anything runs
        for name in sorted(names):
            profiles[name] = load_profile(args.profile_dir / "hardware" / f"{name}.yaml")
    except ConfigError as exc:
        print("\n".join(f"error: {line}" for line in exc.problems), file=sys.stderr)
        return 2
    out = (args.out or Path("outputs/model_check") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lines, summaries = [HEADER], []
    for model, world, ac, accum in grid(args):
        run = out / f"{model}-w{world}-ac{int(ac)}-a{accum}"
        drift = probe_ratio(profiles[args.profile.format(world=world)].probe_s)
        code = bench(
            [
                "--warmup",
                str(args.warmup),
                "--steps",
                str(args.steps),
                "--out",
                str(run),
                *overrides_for(args, model, world, ac, accum),
            ]
        )
        result = run / "bench" / "result.json"
        if code != 0 or not result.exists():
            lines.append(f"| {model} | {world} | {ac} | {accum} | failed (exit {code}) |")
            continue
        summary = json.loads(result.read_text())
        summary["probe_ratio"] = drift
        summaries.append(summary)
        lines.append(row(summary, model, world, ac, accum))
        (out / "model_check.md").write_text("\n".join(lines) + "\n")  # after every run
    (out / "model_check.json").write_text(json.dumps(summaries) + "\n")
    print("\n".join(lines))
    ratios = [s["step_time_s_median"] / s["predicted_step_s"] for s in summaries]
    within = sum(0.75 <= r <= 1.25 for r in ratios)
    drifted = sum(1 for s in summaries if s["probe_ratio"] and abs(s["probe_ratio"] - 1) > 0.1)
    print(
        f"{within} of {len(ratios)} within +-25 %; {drifted} ran while the speed probe was "
        f"more than 10 % off the profile's; table: {out / 'model_check.md'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
