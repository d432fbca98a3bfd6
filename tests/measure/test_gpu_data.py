"""The GPU check's data step runs here on the CPU: the same comparison of device-resident
and streamed batches with the host loader's (on a GPU: through pinned memory and a side
stream; scripts/gpu_check.sh)."""

from __future__ import annotations

import torch

from toolkit.measure.gpu_data import data_step


def test_the_data_step_finds_device_batches_equal_to_the_host_loaders(tmp_path) -> None:
    result = data_step(tmp_path, torch.device("cpu"), num_times=1500, bench=False)
    assert result["bitwise_equal"] == {"resident": True, "streamed": True}
    assert result["batches_on_device"] and result["streamed_bytes_copied"] > 0
    assert result["placement"].startswith("data: device-resident, ")
    assert result["ok"]
