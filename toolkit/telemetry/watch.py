"""`python -m toolkit.telemetry watch RUN_DIR`: a live view of a running job, read from its
node files through SWMR (the writers keep running undisturbed); `--once` prints one
snapshot."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.runmodel import RATE_FIELD, run_unit
from toolkit.telemetry.read import NoTelemetry, RunData, load_run, node_files

RECENT_STEPS = 20


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None or not np.isfinite(x) else format(x, fmt)


def snapshot(run_dir: Path, run: RunData | None = None) -> Any:
    """A rich renderable of the job's state now (raises NoTelemetry); `run`: files kept open
    between refreshes by the caller (opening and closing 64 node files costs seconds)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    own = run is None
    unit = run_unit(run_dir)  # tokens/s for a token model, samples/s for any other
    rate = RATE_FIELD[unit]
    if run is None:
        run = load_run(run_dir, events=False)  # 100,000s of events in a long run; not shown
    now = time.time()
    try:
        latest = {}
        for n in run.nodes:  # the newest attempt of each node
            if n.node not in latest or n.attempt > latest[n.node].attempt:
                latest[n.node] = n
        nodes = Table(title="Nodes", title_justify="left")
        for h in (
            "node",
            "attempt",
            "GPUs",
            "GPU util %",
            "power W",
            "max temp C",
            "SM MHz",
            "CPU %",
            "last sample",
        ):
            nodes.add_column(h, justify="left" if h == "node" else "right")
        ranks = Table(title=f"Ranks (last {RECENT_STEPS} steps)", title_justify="left")
        for h in (
            "node",
            "rank",
            "step",
            "step ms",
            f"{unit}/s",
            "MFU %",
            "loss",
            "data wait %",
            "last step",
        ):
            ranks.add_column(h, justify="left" if h == "node" else "right")
        for name, n in sorted(latest.items()):
            util, power, temp, clock, last = [], [], [], [], None
            for t in n.gpus.values():
                if len(t) == 0:
                    continue
                if "utilization_gpu_pct" in t:
                    util.append(float(t.tail("utilization_gpu_pct", 1)[0]))
                if "power_w" in t:
                    power.append(float(t.tail("power_w", 1)[0]))
                if "temperature_gpu_c" in t:
                    temp.append(float(t.tail("temperature_gpu_c", 1)[0]))
                if "clock_sm_mhz" in t:
                    clock.append(float(t.tail("clock_sm_mhz", 1)[0]))
                last = float(t.tail("time", 1)[0])
            cpu = None
            if n.host is not None and len(n.host):
                cpu = float(n.host.tail("cpu_pct", 1)[0])
                last = max(last or 0.0, float(n.host.tail("time", 1)[0]))
            nodes.add_row(
                name,
                str(n.attempt),
                str(len(n.gpus)),
                _f(np.mean(util) if util else None, ".0f"),
                _f(np.sum(power) if power else None, ",.0f"),
                _f(max(temp) if temp else None, ".0f"),
                _f(np.mean(clock) if clock else None, ".0f"),
                _f(cpu, ".0f"),
                f"{now - last:.0f} s ago" if last else "-",
            )
            for rank, t in sorted(n.steps.items()):
                if len(t) == 0:
                    ranks.add_row(name, str(rank), "-", "-", "-", "-", "-", "-", "no steps yet")
                    continue
                step_t = t.tail("step_time_s", RECENT_STEPS)
                wait = t.tail("data_wait_s", RECENT_STEPS)
                ranks.add_row(
                    name,
                    str(rank),
                    str(int(t.tail("step", 1)[0])),
                    _f(1000 * float(np.median(step_t)), ",.1f"),
                    _f(float(np.median(t.tail(rate, RECENT_STEPS))) if rate in t else None, ",.0f"),
                    _f(100 * float(np.median(t.tail("mfu", RECENT_STEPS))), ".2f"),
                    _f(float(t.tail("loss", 1)[0]), ".4f"),
                    _f(100 * float(wait.sum() / step_t.sum()) if step_t.sum() > 0 else None, ".1f"),
                    f"{now - float(t.tail('wall_time', 1)[0]):.0f} s ago",
                )
        header = Text(f"{run_dir}  ({len(run.nodes)} node files, {time.strftime('%H:%M:%S')})")
        parts: list[Any] = [header, nodes, ranks]
        parts += [Text(f"skipped {p.name}: {why}", style="yellow") for p, why in run.skipped]
        return Group(*parts)
    finally:
        if own:
            run.close()


def _reopen(run_dir: Path, run: RunData | None) -> RunData:
    """The run's files, opened once and refreshed; opened again when the set changes."""
    if run is not None:
        if [n.path for n in run.nodes] + [p for p, _ in run.skipped] == node_files(run_dir):
            for n in run.nodes:
                n.refresh()
            return run
        run.close()
    return load_run(run_dir, events=False)


def watch(run_dir: Path, once: bool = False, refresh_s: float = 2.0) -> int:
    import sys

    from rich.console import Console
    from rich.live import Live

    console = Console() if sys.stdout.isatty() else Console(width=160)
    if once:
        console.print(snapshot(run_dir))
        return 0
    run = _reopen(run_dir, None)
    with Live(snapshot(run_dir, run), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(refresh_s)
                try:
                    run = _reopen(run_dir, run)
                    live.update(snapshot(run_dir, run))
                except NoTelemetry:
                    raise
                except Exception as exc:  # noqa: BLE001 - a file mid-creation: try again
                    live.console.log(f"read failed, retrying: {type(exc).__name__}: {exc}")
        except KeyboardInterrupt:
            return 0
        finally:
            run.close()
