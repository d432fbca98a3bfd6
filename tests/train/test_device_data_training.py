"""Device-resident data through the real launcher: 2 ranks train on the market with the
samples cut on the device, and the losses are those of the host loader's run, bitwise; the
run's first lines say which path was taken and why."""

from __future__ import annotations

import json

import pytest

from tests.conftest import launch, losses

RUN = [
    "experiment=returns",
    "trainer.steps=6",
    "trainer.progress=false",
    "model.num_layers=1",
    "model.dim=32",
    "data.synthetic_times=2000",
]


@pytest.mark.slow
@pytest.mark.load_tolerant
def test_two_ranks_train_on_device_resident_data_as_on_the_host_loader(tmp_path) -> None:
    runs = {}
    for placement in ("host", "auto"):
        run_dir = tmp_path / placement
        result = launch(*RUN, f"data.placement={placement}", f"hydra.run.dir={run_dir}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[placement] = (run_dir, result.stdout + result.stderr)
    assert "data: host loader (data.placement=host)" in runs["host"][1]
    assert "data: device-resident, 0.49 MiB of a " in runs["auto"][1]
    assert losses(runs["auto"][0]) == losses(runs["host"][0])
    summaries = [json.loads((d / "summary.json").read_text()) for d, _ in runs.values()]
    assert summaries[0]["val_loss"] == summaries[1]["val_loss"]
