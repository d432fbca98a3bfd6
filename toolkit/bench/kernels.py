"""`python -m toolkit.bench.kernels [--size test|bench] [--cases NAME,...] [--dtype D] [--time]`:
every fused kernel against its PyTorch reference, eager and compiled.

For every case (toolkit.kernels.cases.KernelCase) of every importable module of CASE_MODULES
(a module that cannot be imported: one line saying why), three variants run the same inputs:

* `eager`: the reference in plain PyTorch — THE BASELINE, every ratio is against it;
* `compiled`: the reference under torch.compile (what the compiler alone gets);
* `kernel`: the fused kernel (Liger's or ours).

Each is measured for one forward + backward (out.float().sum().backward()): the peak bytes
allocated, the bytes saved for backward and the largest tensor made in the forward
(toolkit.bench.kernel_measure says how, per device), the largest forward difference from the
reference and, on a GPU (or with --time),
the median time per call over --reps interleaved repetitions. Interpreted Triton on a CPU
(TRITON_INTERPRET=1) is a correctness tool, not a speed: times are off on CPU unless --time.

`--device meta` counts only the bytes saved for backward, at any size in no time (exact: the
shapes decide them), for the eager reference and the fused op's meta entry
(`KernelCase.meta_kernel`; a case without one: the eager row only).

One markdown table is printed and OUT/kernels.json written (machine, load, command, rows).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("eager", "compiled", "kernel")
BASELINE = "eager"  # the plain PyTorch reference: every ratio is variant / eager
DTYPES = ("float32", "bfloat16", "float16")
SIZES = ("test", "bench")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolkit.bench.kernels")
    p.add_argument("--size", default="bench", help="test (seconds, interpreted) | bench")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument(
        "--dtype", default="", help="float32 | bfloat16 | float16 (default: bf16 on GPU)"
    )
    p.add_argument("--device", default="", help="cuda | cpu | meta (default: cuda if any)")
    p.add_argument("--time", action="store_true", help="time on CPU too (not a speed measure)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per variant")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend")
    p.add_argument("--out", type=Path, default=None, help="directory for kernels.json")
    p.add_argument(
        "--modules", default="", help="comma-separated case modules (default: CASE_MODULES)"
    )
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.size not in SIZES:
        problems.append(f"--size={args.size}: allowed: {', '.join(SIZES)}")
    if args.dtype and args.dtype not in DTYPES:
        problems.append(f"--dtype={args.dtype}: allowed: {', '.join(DTYPES)}")
    if args.device and args.device not in ("cuda", "cpu", "meta"):
        problems.append(f"--device={args.device}: allowed: cuda, cpu, meta")
    if args.reps < 1:
        problems.append(f"--reps={args.reps}: must be >= 1")
    return problems


def collect(modules: tuple[str, ...], names: set[str]) -> tuple[list[Any], list[str]]:
    """(the cases of every importable module, filtered by name; one line per module that
    could not be imported)."""
    cases, skipped = [], []
    for module in modules:
        try:
            found = importlib.import_module(module).BENCH_CASES
        except ImportError as exc:  # the module, or the library it wraps, is not installed
            skipped.append(f"{module}: skipped ({exc})")
            continue
        cases += [c for c in found if not names or c.name in names]
    return cases, skipped


def one_line(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def measure_case(case: Any, args: argparse.Namespace, device: Any, dtype: Any) -> list[dict]:
    """The three variants' rows for one case; a variant that fails gets its error instead."""
    import torch

    from toolkit.bench import kernel_measure as km

    try:
        inputs = case.make_inputs(args.size, dtype, device)
    except Exception as exc:  # noqa: BLE001 - e.g. a shape too large for this device
        error = f"make_inputs: {one_line(exc)}"
        return [
            {"case": case.name, "shape": case.shape, "variant": v, "error": error} for v in VARIANTS
        ]
    if device.type == "meta":  # sizes only: what the forward keeps for backward
        fns = {"eager": case.reference, "kernel": case.meta_kernel}
        rows = [
            {
                "case": case.name,
                "shape": case.shape,
                "variant": n,
                "saved_bytes": km.saved_bytes(f, inputs),
            }
            for n, f in fns.items()
            if f is not None
        ]
        add_ratios(rows)
        return rows
    fns = {
        "eager": case.reference,
        "compiled": torch.compile(case.reference, backend=args.compile_backend),
        "kernel": case.kernel,
    }
    rows: dict[str, dict[str, Any]] = {}
    working = {}
    for name, fn in fns.items():
        row: dict[str, Any] = {"case": case.name, "shape": case.shape, "variant": name}
        try:
            km.call(fn, inputs, case.backward)  # compiles / autotunes outside the measures
            row["peak_bytes"] = km.peak_bytes(fn, inputs, case.backward, device)
            row["saved_bytes"] = km.saved_bytes(fn, inputs) if case.backward else 0
            row["largest_bytes"] = km.largest_bytes(fn, inputs)
            row["max_abs_diff"] = km.max_abs_difference(fn, case.reference, inputs)
            working[name] = fn
        except Exception as exc:  # noqa: BLE001 - one failing variant must not hide the others
            row["error"] = one_line(exc)
        rows[name] = row
    if working and (device.type == "cuda" or args.time):
        times = km.interleaved_times(working, inputs, case.backward, device, args.reps)
        for name, samples in times.items():
            rows[name]["time_s_median"] = statistics.median(samples)
            rows[name]["time_s_min"] = min(samples)
            rows[name]["time_s_max"] = max(samples)
    add_ratios(list(rows.values()))
    return list(rows.values())


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """variant / eager for time, peak and saved bytes (the baseline's own ratio is 1)."""
    base = next((r for r in rows if r["variant"] == BASELINE and "error" not in r), None)
    if base is None:
        return
    for r in rows:
        for key in ("time_s_median", "peak_bytes", "saved_bytes"):
            if key in r and base.get(key):
                r[f"{key}_vs_eager"] = r[key] / base[key]


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def fmt(row: dict[str, Any], key: str) -> str:
    """The value (ms for times, bytes with a unit for memory) and its ratio to eager."""
    if key not in row:
        return "—"
    ratio = row.get(f"{key}_vs_eager")
    text = f"{row[key] * 1000:,.3f} ms" if key.startswith("time") else human_bytes(row[key])
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | shape (bench size) | variant | time/call (vs eager) | peak (vs eager) "
        "| saved for backward (vs eager) | largest tensor | max abs diff vs reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['shape']} | {r['variant']} | {r['error']} ||||")
            continue
        diff = f"{r['max_abs_diff']:.3g}" if "max_abs_diff" in r else "—"  # none on meta
        lines.append(
            f"| {r['case']} | {r['shape']} | {r['variant']} "
            f"| {fmt(r, 'time_s_median')} | {fmt(r, 'peak_bytes')} "
            f"| {fmt(r, 'saved_bytes')} | {fmt(r, 'largest_bytes')} | {diff} |"
        )
    return "\n".join(lines)


def machine(device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    problems = check_args(args)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        # Triton kernels run on CPU only interpreted; Triton reads this at its first import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    from toolkit.kernels.cases import CASE_MODULES

    names = {n for n in args.cases.split(",") if n}
    modules = tuple(m for m in args.modules.split(",") if m) or CASE_MODULES
    cases, skipped = collect(modules, names)
    for line in skipped:
        print(line)
    unknown = names - {c.name for c in cases}
    if unknown:
        print(f"error: --cases: {', '.join(sorted(unknown))} not found", file=sys.stderr)
        return 2
    rows = [row for case in cases for row in measure_case(case, args, device, dtype)]
    timed = device.type == "cuda" or args.time
    print(
        f"{len(cases)} cases, {args.size} size, {dtype}, {device}"
        + ("" if timed else " (not timed: interpreted Triton on CPU is not a speed; --time)")
    )
    print(table(rows))
    out = (args.out or Path("outputs/bench/kernels") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": "python -m toolkit.bench.kernels " + " ".join(argv),
        "machine": machine(device),
        "device": str(device),
        "dtype": str(dtype),
        "size": args.size,
        "baseline": BASELINE,
        "skipped": skipped,
        "rows": rows,
    }
    (out / "kernels.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out / 'kernels.json'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
