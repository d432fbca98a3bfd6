"""A hang ends the job in the node agent, before any tracker hears of it: the next attempt's
rank 0 sends each hang dump of the run to its trackers once, as a `hang` event; a hang that
ends the run for good (a local run, Slurm's last attempt) is sent by whoever ends it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, launch
from toolkit.config.compose import compose_raw, job_to_dict, to_job
from toolkit.config.tracking import TrackingConfig
from toolkit.errors import EXIT_HANG
from toolkit.fault.hang import write_hang_summary
from toolkit.tracking.build import build_tracking_sinks, unsent_hangs

SUMMARY = {
    "stuck_ranks": [1],
    "stuck_hosts": ["n2"],
    "waiting_ranks": [0],
    "collective": "all_reduce #36",
    "stuck_for_s": 612.0,
    "step": 3,
    "message": "hang: rank 1 on node n2 stuck in all_reduce #36 for 612 s",
    "hosts_by_rank": {"0": "n1", "1": "n2"},
}


def test_each_hang_dump_is_sent_once_as_an_event(tmp_path):
    (tmp_path / "hangs" / "20261203-080000").mkdir(parents=True)
    write_hang_summary(tmp_path / "hangs" / "20261203-080000", SUMMARY)
    (event,) = unsent_hangs(tmp_path)
    assert (event.name, event.step) == ("hang", 3)
    assert event.attrs["message"].startswith("hang: rank 1 on node n2")
    assert unsent_hangs(tmp_path) == []  # the next attempt does not send it again


def test_the_next_attempts_tracker_receives_the_hang(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "hangs" / "20261203-080000").mkdir(parents=True)
    write_hang_summary(tmp_path / "hangs" / "20261203-080000", SUMMARY)
    cfg = TrackingConfig(tensorboard=True)
    (trackers,) = build_tracking_sinks(cfg, True, tmp_path, {"seed": 0})
    trackers.close()
    logdir = tmp_path / "tracking" / "tensorboard"
    tags = EventAccumulator(str(logdir)).Reload().Tags()
    assert any(
        "event/hang" in tag
        for tags_of in tags.values()
        if isinstance(tags_of, list)
        for tag in tags_of
    ), tags


def hang_texts(run_dir: Path) -> list[dict]:
    """The attributes of every `hang` event in the run's TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = run_dir / "tracking" / "tensorboard"
    texts = []
    for events_file in sorted(logdir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events_file), size_guidance={"tensors": 0}).Reload()
        if "event/hang/text_summary" in acc.Tags()["tensors"]:
            for t in acc.Tensors("event/hang/text_summary"):
                texts.append(json.loads(t.tensor_proto.string_val[0].decode()))
    return texts


@pytest.mark.slow
@pytest.mark.waits
def test_a_local_hang_that_ends_the_run_reaches_the_trackers_once(tmp_path, tiny):
    result = launch(
        *tiny,
        "trainer.steps=500",
        "fault.hang_at_step=3",
        "fault.hang_rank=1",
        "fault.hang_where=collective",
        "fault.hang_timeout_s=5",
        "fault.hang_startup_timeout_s=60",
        "tracking=tensorboard",
        f"hydra.run.dir={tmp_path}",
        timeout=180,
    )
    assert result.returncode == EXIT_HANG, result.stderr[-3000:]
    (sent,) = hang_texts(tmp_path)  # sent by the launcher: there is no next attempt
    (dump,) = [p for p in (tmp_path / "hangs").iterdir() if not p.name.startswith(".")]
    assert sent["dump"] == str(dump)
    assert sent["stuck_ranks"] == "1"
    assert sent["message"] == result.stderr.strip().splitlines()[-1]
    assert unsent_hangs(tmp_path) == []  # a relaunch into the run dir does not send it again


def test_the_last_slurm_attempts_after_hang_action_sends_the_hang(tmp_path):
    """Nothing to requeue (here checkpoint.requeue=false; also the last allowed attempt):
    the after-hang action, the one process that knows the job ends, sends the hang."""
    job = to_job(compose_raw(["tracking=tensorboard", "telemetry=off"]))
    OmegaConf.save(OmegaConf.create(job_to_dict(job)), tmp_path / "config.yaml")
    dump = tmp_path / "hangs" / "20261203T080000Z"
    dump.mkdir(parents=True)
    write_hang_summary(dump, SUMMARY | {"action": "pending"})
    request = {
        "run_dir": str(tmp_path),
        "summary": SUMMARY,
        "slurm_job_id": "4242",
        "requeue": False,
        "max_restarts": 3,
        "nodes": 2,
        "exclude": None,
        "partition": None,
        "exclude_nodes": True,
    }
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.executors.after_hang"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    action = json.loads(done.stdout.strip().splitlines()[-1])["action"]
    assert action.startswith("ended (checkpoint.requeue=false")
    (sent,) = hang_texts(tmp_path)
    assert (sent["dump"], sent["stuck_ranks"], sent["action"]) == (str(dump), "1", action)
    assert unsent_hangs(tmp_path) == []
