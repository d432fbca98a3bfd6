"""A script's process-level progress (its wrapper's view until it calls
toolkit.session.heartbeat()): CPU time counts from its last move, so a script that gets a
tenth of a core on a loaded machine still moves, while one blocked in a collective, whose
threads spend a few milliseconds a second, does not (it is then a hang)."""

from __future__ import annotations

from toolkit.tasks.script import Progress


def test_cpu_time_accumulates_from_the_last_move(tmp_path):
    progress = Progress(tmp_path / "no-beats-yet")
    # 0.02 CPU s per 0.2 s poll (a tenth of a core): each poll alone is below 0.05 s ...
    assert [progress.moved(0, cpu) for cpu in (0.02, 0.04, 0.06)] == [False, False, True]
    assert progress.moved(10, 0.06)  # new output is progress at once


def test_a_trickle_of_cpu_over_a_long_wait_is_not_progress(tmp_path):
    progress = Progress(tmp_path / "no-beats-yet")
    assert progress.moved(0, 1.0)
    progress.moved_at -= 100.0  # 100 s blocked since: 0.06 CPU s is 0.06 % of a core
    assert not progress.moved(0, 1.06)
    progress.moved_at += 99.0  # the same CPU time within 1 s: 6 % of a core
    assert progress.moved(0, 1.06)
