"""session.log() inside a launch (the spec the rank wrapper hands over, in-process here): a
value that is not a number is one warning per name and is left out; no row is lost."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from toolkit import session


@pytest.fixture
def launched(tmp_path, monkeypatch):
    """A script's rank 1 (rank 0 would also start the job's trackers), telemetry off."""
    spec = session.SessionSpec(
        run_dir=str(tmp_path), rank=1, attempt=0, checkpoint_dir=str(tmp_path / "ckpt"),
        beat_path=str(tmp_path / "beat"),
    )  # fmt: skip
    monkeypatch.setenv(session.ENV, spec.to_env())
    monkeypatch.setattr(session, "_session", None)
    yield tmp_path / "metrics" / "rank1.jsonl"
    monkeypatch.setattr(session, "_session", None)


def test_a_non_numeric_value_is_one_warning_and_no_row_is_lost(launched, caplog):
    caplog.set_level(logging.WARNING, logger="toolkit.session")
    session.log(1, loss=torch.tensor(0.5), lr=np.float32(0.1), phase="warmup")
    session.log(2, loss="abc", tokens=64)
    session.log(3, loss=0.25, phase="main", grads=torch.ones(2))
    session.log("four", loss=0.125)
    rows = [json.loads(line) for line in launched.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows[:1] + rows[2:]] == [0.5, 0.25, 0.125]
    assert rows[0]["lr"] == pytest.approx(0.1) and rows[1]["tokens"] == 64
    assert all("phase" not in r and "grads" not in r for r in rows)
    assert "loss" not in rows[1]  # left out: absent from its line, not NaN or 0.0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4, warned  # phase, loss, grads, step: once each
    assert "log(step=1, phase='warmup'): not a number; phase is left out" in warned[0]
    assert "log(step=2, loss='abc'): not a number" in warned[1]
    assert "log(step='four'): not a whole number; recorded as step 4" in warned[3]
    assert all("\n" not in w for w in warned)


def test_the_record_keeps_its_types(launched):
    session.log(1, loss=np.float64(1.5), tokens=np.int64(128), step_time_s=2)
    (row,) = [json.loads(line) for line in launched.read_text().splitlines()]
    assert row["tokens"] == 128 and isinstance(row["tokens"], int)
    assert row["tokens_per_s"] == 64.0 and row["loss"] == 1.5
