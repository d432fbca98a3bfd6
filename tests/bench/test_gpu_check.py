"""The GPU validation script's CPU-testable parts; the GPU path itself needs a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import h5py
import pytest
import torch

from toolkit.bench.gpu import hardware_preset, matmul_peak
from toolkit.bench.nvml_sampler import NvmlSampler, count_samples

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "gpu")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "no CUDA device visible" in proc.stdout
    assert "nothing was run" in proc.stdout
    assert proc.stderr == ""  # no traceback, no warnings
    assert not (tmp_path / "gpu").exists()


def test_device_names_map_to_datasheet_presets():
    assert hardware_preset("NVIDIA H100 80GB HBM3") == "h100"
    assert hardware_preset("NVIDIA H200") == "h200"
    assert hardware_preset("NVIDIA A100-SXM4-80GB") == "a100"
    assert hardware_preset("NVIDIA GeForce RTX 4090") is None


def test_matmul_peak_counts_two_n_cubed_flops_per_matmul():
    # On CPU with a small matrix: a positive, finite, plausible rate (< 10 TFLOP/s).
    flops = matmul_peak(torch.device("cpu"), torch.float32, n=64, iters=5)
    assert 0 < flops < 1e13


class FakeNvml:
    """Stands in for pynvml (the only mock allowed here): a fixed reading per call."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, fail_every: int = 0):
        self.calls = 0
        self.fail_every = fail_every
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=12 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 450_000  # milliwatts

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980


def test_nvml_sampler_writes_nonempty_hdf5_and_survives_failed_samples(tmp_path):
    nvml = FakeNvml(fail_every=3)
    sampler = NvmlSampler(interval_s=0.01, nvml=nvml)
    sampler.start()
    deadline = time.time() + 10
    while nvml.calls < 10 and time.time() < deadline:
        time.sleep(0.01)
    sampler.stop()
    path = tmp_path / "telemetry.h5"
    written = sampler.write_h5(path)
    assert written == count_samples(path) > 0
    assert sampler.errors >= 1 and nvml.shutdown
    with h5py.File(path) as f:
        assert f["nvml/power_w"][0] == 450.0  # watts, converted from milliwatts
        assert f["nvml/mem_used_bytes"][0] == 12 * 2**30
        assert f["nvml"].attrs["errors"] == sampler.errors


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_passes_on_a_cuda_machine_within_8_minutes(tmp_path):
    started = time.time()
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "gpu")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.time() - started < 480
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert report["nccl"]["ok"]
    assert report["telemetry"]["samples"] > 0
    assert {(r["name"], r["compile"]) for r in report["runs"]} == {
        ("gpt_small", False),
        ("gpt_small", True),
        ("gpt_1b", False),
        ("gpt_1b", True),
    }
    assert "passed in" in proc.stdout[-1000:]  # the table's caption, printed last
