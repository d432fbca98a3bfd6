"""After a crash and a resume, every record says which attempt wrote it, and every reader
(the report, compare, `status`, the trackers) takes the last attempt's record of a step."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import launch
from toolkit.cli.rundir import read_run
from toolkit.events import Event, JsonlSink, StepRecord, last_attempt, read_steps

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing


def record(step: int, loss: float) -> StepRecord:
    zeros = dict.fromkeys(("step_time_s", "data_wait_s", "forward_backward_s", "optimizer_s"), 0.1)
    return StepRecord(
        step=step, wall_time=1000.0 + step, loss=loss, grad_norm=1.0, lr=1e-3, tokens=8,
        tokens_per_s=80.0, mfu=0.0, mem_peak_bytes=0, **zeros,
    )  # fmt: skip


def test_a_resumed_writer_stamps_the_next_attempt_and_readers_keep_its_records(tmp_path):
    metrics = tmp_path / "metrics"
    first = JsonlSink(metrics, rank=0)
    for step in range(1, 5):  # steps 1-4; the checkpoint was at step 2, then a crash
        first.write_step(record(step, loss=1.0))
    first.write_event(Event("eval", 0.0, 1.0, step=4))
    first.close()
    second = JsonlSink(metrics, rank=0)  # relaunched into the same run dir: no restart count
    for step in range(3, 6):
        second.write_step(record(step, loss=2.0))
    second.close()
    assert (first.attempt, second.attempt) == (0, 1)
    assert JsonlSink(metrics, rank=0, restart_count=5).attempt == 5  # Slurm's count when higher

    raw = read_steps(metrics / "rank0.jsonl")
    assert [(r["step"], r["attempt"]) for r in raw] == [
        (1, 0), (2, 0), (3, 0), (4, 0), (3, 1), (4, 1), (5, 1),
    ]  # fmt: skip
    kept = last_attempt(raw)
    assert [(r["step"], r["attempt"], r["loss"]) for r in kept] == [
        (1, 0, 1.0), (2, 0, 1.0), (3, 1, 2.0), (4, 1, 2.0), (5, 1, 2.0),
    ]  # fmt: skip
    assert read_steps(metrics / "events-rank0.jsonl")[0]["attempt"] == 0


def test_a_later_attempt_supersedes_also_the_steps_it_did_not_reach():
    # Attempt 0 ran to step 6, attempt 1 resumed at step 3 and crashed at step 4: steps 5-6
    # of attempt 0 belong to an abandoned history (TensorBoard's purge does the same).
    rows = [{"step": s, "attempt": 0} for s in range(1, 7)]
    rows += [{"step": s, "attempt": 1} for s in (3, 4)]
    rows += [{"step": s, "attempt": 2} for s in (4, 5)]
    kept = [(r["step"], r["attempt"]) for r in last_attempt(rows)]
    assert kept == [(1, 0), (2, 0), (3, 1), (4, 2), (5, 2)]


@pytest.mark.slow
def test_a_crashed_run_resumed_reads_as_its_last_attempt(tmp_path):
    """A 2-rank run crashes at step 7 after its checkpoint at step 4 and is launched again:
    steps 5-7 are written twice, and every reader keeps the resumed attempt's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from toolkit.telemetry.compare import step_values
    from toolkit.telemetry.read import load_run
    from toolkit.telemetry.report.analysis import collect_steps

    run_dir = tmp_path / "run"
    common = ["checkpoint.enabled=true", "checkpoint.interval_steps=4", "tracking=tensorboard"]
    crashed = launch(run_dir, *common, "fault.fail_at_step=7")
    assert crashed.returncode != 0
    done = launch(run_dir, *common)
    assert done.returncode == 0, done.stderr[-3000:]

    raw = read_steps(run_dir / "metrics" / "rank0.jsonl")
    assert [(r["step"], r["attempt"]) for r in raw if r["step"] > 4] == [
        (5, 0), (6, 0), (5, 1), (6, 1), (7, 1), (8, 1),
    ]  # fmt: skip
    final = {r["step"]: r["loss"] for r in raw if r["attempt"] == 1}
    kept = last_attempt(raw)
    assert [r["step"] for r in kept] == list(range(1, 9))
    assert all(r["attempt"] == 1 for r in kept if r["step"] > 4)

    # The report's (and compare's) per-rank series from the node telemetry files.
    run = load_run(run_dir)
    try:
        series = collect_steps(run, skip_first_steps=0)
    finally:
        run.close()
    for rank in (0, 1):
        steps = series[rank].columns["step"].tolist()
        assert steps == list(range(1, 9)), steps
        assert series[rank].attempt[4:].tolist() == [1, 1, 1, 1]
    assert len(step_values(run_dir, skip_first_steps=0)["step_time_s"]) == 8

    # `status` and `runs`: the last step, two attempts.
    info = read_run(run_dir, ask_slurm=False)
    assert (info.steps, info.attempts) == (8, 2)

    # TensorBoard's own reader: one loss per step, the resumed attempt's from step 5 on.
    tb = EventAccumulator(str(run_dir / "tracking" / "tensorboard"))
    tb.Reload()
    loss = {e.step: e.value for e in tb.Scalars("train/loss")}
    assert sorted(loss) == list(range(1, 9))
    assert all(loss[s] == pytest.approx(final[s], rel=1e-6) for s in range(5, 9))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8
