"""A hang ends the job in the node agent, before any tracker hears of it: the next attempt's
rank 0 sends each hang dump of the run to its trackers once, as a `hang` event."""

from __future__ import annotations

from toolkit.config.tracking import TrackingConfig
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
