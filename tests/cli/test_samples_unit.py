"""Samples are a first-class unit (issue 45 item 4): a samples model (model=ts_transformer
data=returns) shows samples/s, and MFU from its FLOPs per sample, in the run's summary, its
progress lines, `runs`, `status`, the report, `watch`, `compare`, the trackers,
`perfmodel` and `plan`; a token model (gpt_tiny) shows tokens/s.

The texts are golden files (tests/golden/readers_<unit>.txt, regenerate with
UPDATE_GOLDEN=1 and review): numbers become N and paths <run>, so what they hold is the
labels and units each command prints, not this machine's speed.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

from tests.cli.test_help import check_golden
from toolkit.events import StepRecord, read_steps

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]

NUMBER = re.compile(r"(?<![A-Za-z\d])\d[\d,]*(\.\d+)?(e[-+]\d+)?")


def normalised(text: str, run_dir: Path) -> str:
    """Paths as <run>, numbers as N, runs of spaces and table rules as one space."""
    text = text.replace(str(run_dir), "<run>")
    text = NUMBER.sub("N", text)
    lines = [re.sub(r"[ ┃│━─┏┓┗┛┡┩┣┫╇╋┳┻]+", " ", line).strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line) + "\n"


def reader_texts(run_dir: Path, tmp_path: Path, capsys, caplog) -> str:
    """What each reader prints about one finished run, one section per command."""
    from rich.console import Console

    from toolkit.cli.status import runs, status
    from toolkit.config.telemetry import ReportConfig
    from toolkit.tasks.train import print_summary
    from toolkit.telemetry.report.build import build_report
    from toolkit.telemetry.report.tables import print_report
    from toolkit.telemetry.watch import snapshot
    from toolkit.train.console import ConsoleSink

    sections = {}
    assert runs(str(run_dir), as_json=False) == 0
    sections["runs"] = capsys.readouterr().out
    assert status(str(run_dir), as_json=False) == 0
    sections["status"] = capsys.readouterr().out
    report = build_report(run_dir, tmp_path / "report", ReportConfig(sacct=False, plots=False))
    out = io.StringIO()
    print_report(report, Console(file=out, width=200))
    # The node and rank tables' headers (whether stragglers were found depends on the load).
    tables = [line for line in out.getvalue().splitlines() if line.startswith("┃ node ")]
    sections["report"] = "\n".join([out.getvalue().splitlines()[0], *tables])
    watched = io.StringIO()
    Console(file=watched, width=200).print(snapshot(run_dir))
    sections["watch"] = "\n".join(line for line in watched.getvalue().splitlines() if "┃" in line)
    unit = json.loads((run_dir / "model.json").read_text())["unit"]
    console = ConsoleSink(4, 0, 4, progress=False, unit=unit)
    with caplog.at_level(logging.INFO, logger="toolkit.train.console"):
        console.write_step(StepRecord(**read_steps(run_dir / "metrics" / "rank0.jsonl")[-1]))
    sections["progress"] = caplog.records[-1].getMessage()
    summary = json.loads((run_dir / "summary.json").read_text())
    print_summary(summary)
    sections["summary"] = capsys.readouterr().out
    return "".join(f"== {name}\n{text.strip()}\n" for name, text in sections.items())


@pytest.mark.parametrize("run", ["samples_run", "tokens_run"])
def test_every_reader_shows_the_models_own_unit(run, request, tmp_path, capsys, caplog):
    run_dir = request.getfixturevalue(run)
    unit = "samples" if run == "samples_run" else "tokens"
    model = json.loads((run_dir / "model.json").read_text())
    assert model["unit"] == unit and model["flops_per_sample"] > 0
    text = normalised(reader_texts(run_dir, tmp_path, capsys, caplog), run_dir)
    check_golden(f"readers_{unit}.txt", text)
    other = "tokens/s" if unit == "samples" else "samples/s"
    assert other not in text and f"{unit}/s" in text


def test_compare_perfmodel_and_plan_use_the_unit(samples_run, tokens_run, capsys):
    from toolkit.perfmodel.__main__ import main as perfmodel
    from toolkit.plan import main as plan
    from toolkit.telemetry.compare import compare

    both = compare(samples_run, samples_run)
    assert both["unit"] == "samples"
    assert [r["metric"] for r in both["metrics"] if r["metric"].endswith("per_s")] == [
        "samples_per_s"
    ]
    tokens = compare(tokens_run, tokens_run)
    assert [r["metric"] for r in tokens["metrics"] if r["metric"].endswith("per_s")] == [
        "tokens_per_s"
    ]
    assert compare(samples_run, tokens_run)["unit"] == "samples"  # what both models have

    assert perfmodel(["--run", str(samples_run), "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["unit"] == "samples" and predicted["samples_per_s"] > 0
    assert 0 < predicted["mfu"] < 1  # from the recorded FLOPs per sample
    assert plan(["--run", str(samples_run), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "global batch 8 samples" in out and "samples/s" in out and "tokens/s" not in out
    assert perfmodel(["--run", str(tokens_run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unit"] == "tokens"


def test_a_samples_models_trackers_get_samples_per_s_not_tokens_per_s(samples_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from toolkit.config.tracking import TrackingConfig
    from toolkit.tracking import build_tracking_sinks

    run_dir = tmp_path / "run"
    (run_dir / "tracking").mkdir(parents=True)
    cfg = TrackingConfig(tensorboard=True, node_series=False, flush_interval_s=0.0)
    (sink,) = build_tracking_sinks(cfg, True, run_dir, {"model": {}}, unit="samples")
    steps = read_steps(samples_run / "metrics" / "rank0.jsonl")
    for step in steps:
        sink.write_step(StepRecord(**step))
    sink.close()
    tags = EventAccumulator(str(run_dir / "tracking" / "tensorboard")).Reload().Tags()["scalars"]
    assert "train/samples_per_s" in tags and "train/mfu" in tags
    assert "train/tokens_per_s" not in tags and "train/tokens" not in tags
