"""The launch group's numbers are refused by name before any rank starts: a grace period
that is not a finite number of seconds (NaN passes every comparison and would never
escalate to SIGKILL) and a log cap too small to hold a line."""

from __future__ import annotations

import pytest

from toolkit.launch import main as launch_main

REFUSED = [
    ("launch.kill_grace_s=nan", "launch.kill_grace_s=nan: must be a finite number of seconds"),
    ("launch.kill_grace_s=inf", "launch.kill_grace_s=inf: must be a finite number of seconds"),
    ("launch.kill_grace_s=-1", "launch.kill_grace_s=-1.0: must be a finite number of seconds"),
    ("launch.max_log_bytes=100", "launch.max_log_bytes=100: must be 0 (no cap) or a whole"),
    ("launch.max_log_bytes=-1", "launch.max_log_bytes=-1: must be 0 (no cap) or a whole"),
]


@pytest.mark.parametrize(("override", "said"), REFUSED, ids=[o for o, _ in REFUSED])
def test_a_bad_grace_period_or_log_cap_is_one_line_and_exit_2(override, said, capsys, tmp_path):
    assert launch_main([override, f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "run" / "logs").exists()  # no rank started


def test_zero_grace_and_no_log_cap_are_allowed(capsys):
    assert (
        launch_main(["launch.kill_grace_s=0", "launch.max_log_bytes=0", "launch.dry_run=true"]) == 0
    )
