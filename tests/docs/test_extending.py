"""docs/extending.md runs as written: its `file:` blocks make a scratch project (your
package, your data script, your config directory), its `run` blocks are run there in order
with the project on PYTHONPATH, and the runs they start train and leave what the page says.
The `entry-points` block is installed as an installed package's metadata (a dist-info
directory), which is what `pip install` of that pyproject writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

DOC = REPO / "docs" / "extending.md"
BLOCK = re.compile(
    r"<!-- (file: (?P<path>\S+)|run|entry-points) -->\n```\w*\n(?P<body>.*?)```", re.S
)


def blocks() -> list[tuple[str, str | None, str]]:
    """(kind, path, body) of every marked block, in the page's order."""
    out = []
    for m in BLOCK.finditer(DOC.read_text()):
        kind = "file" if m.group("path") else m.group(1)
        out.append((kind, m.group("path"), m.group("body")))
    return out


def install_entry_points(project: Path, toml: str) -> None:
    dist = project / "mypkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    lines = [ln for ln in toml.splitlines() if ln.strip() and not ln.startswith("#")]
    header = lines[0].replace('project.entry-points."toolkit.models"', "toolkit.models")
    entries = [ln.replace('"', "") for ln in lines[1:]]  # TOML strings -> INI values
    (dist / "entry_points.txt").write_text("\n".join([header, *entries]) + "\n")


@pytest.mark.slow
def test_every_example_of_the_extending_page_runs(tmp_path):
    found = blocks()
    assert sum(kind == "run" for kind, _, _ in found) >= 5
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    for kind, path, body in found:
        if kind == "file":
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(body)
        elif kind == "entry-points":
            install_entry_points(tmp_path, body)
        else:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body.replace("python ", "$PY ")],
                cwd=tmp_path,
                env={**env, "PY": sys.executable},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{body}\n{done.stderr[-3000:]}"
    for run in ("lstm", "lstm-file", "tcn", "qwen", "callback", "registered"):
        summary = json.loads((tmp_path / "runs" / run / "summary.json").read_text())
        assert summary["stop_reason"] == "completed", run
        assert summary["final_loss"] < summary["first_loss"] or run == "registered", run
    lstm = json.loads((tmp_path / "runs" / "lstm" / "summary.json").read_text())
    assert lstm["throughput_unit"] == "samples"
    assert (tmp_path / "runs" / "lstm" / "checkpoints").is_dir()
    callback = json.loads((tmp_path / "runs" / "callback" / "summary.json").read_text())
    assert callback["max_grad_norm"] > 0
    # The eval metric for your models as for the built-in one: the LSTM (its own loss
    # method) and the TCN (a loss function of yours) are scored by rank IC.
    for run in ("lstm", "tcn"):
        summary = json.loads((tmp_path / "runs" / run / "summary.json").read_text())
        assert -1.0 <= summary["val_ic"] <= 1.0, run
    # A callback's series at every step: in the metrics file, the trackers and the report.
    lines = [json.loads(ln) for ln in (tmp_path / "runs/callback/metrics/rank0.jsonl").open()]
    assert [ln["step"] for ln in lines] == list(range(1, 11))
    assert all(ln["weight_norm"] > 0 and ln["rank_tokens"] > 0 for ln in lines)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(tmp_path / "runs/callback/tracking/tensorboard")).Reload()
    weight_norm = {e.step: e.value for e in tb.Scalars("train/weight_norm")}
    assert weight_norm == pytest.approx({ln["step"]: ln["weight_norm"] for ln in lines})
    assert tb.Scalars("eval/max_grad_norm")
    report = json.loads((tmp_path / "runs/callback/telemetry/report/summary.json").read_text())
    assert {"weight_norm", "rank_tokens", "eval/max_grad_norm"} <= set(report["custom_series"])
