"""The node sources: NVML (through the fake), InfiniBand sysfs (a fake mlx5 tree), psutil."""

from __future__ import annotations

import numpy as np
import pytest

from tests.telemetry.fakes import FakeNvml, advance_counters, make_mlx5_tree
from toolkit.telemetry.sources import Rate
from toolkit.telemetry.sources.host import HostSource
from toolkit.telemetry.sources.infiniband import InfinibandSource
from toolkit.telemetry.sources.nvml import NvmlSource
from toolkit.telemetry.sources.nvml_extras import XID_DRAIN_MAX


def test_rate_is_nan_first_and_after_a_counter_reset():
    rate = Rate()
    assert np.isnan(rate("x", 0.0, 100))
    assert rate("x", 2.0, 300) == 100.0
    assert np.isnan(rate("x", 3.0, 10))  # reset: no negative rate


def test_nvml_columns_follow_what_each_gpu_offers():
    source = NvmlSource(FakeNvml(count=2), interval_s=1.0)
    assert source.absent_reason is None
    specs = {s.path: s for s in source.specs()}
    assert sorted(specs) == ["gpu/0", "gpu/1"]
    gpu0 = [c.name for c in specs["gpu/0"].columns]
    gpu1 = [c.name for c in specs["gpu/1"].columns]
    for name in (
        "time",
        "utilization_gpu_pct",
        "power_w",
        "energy_j",
        "clock_event_reasons",
        "pcie_tx_bytes_per_s",
        "remapped_rows_pending",
        "gpm_tensor_activity_pct",
    ):
        assert name in gpu0
    assert "nvlink_tx_bytes_per_s" in gpu0 and "nvlink_tx_bytes_per_s" not in gpu1
    assert "retired_pages_sbe" not in gpu0  # NotSupported on Hopper: left out, and said so
    assert any(u.startswith("retired_pages") for u in specs["gpu/0"].attrs["unsupported"])
    assert specs["gpu/0"].attrs["name"] == "NVIDIA H100 80GB HBM3"
    assert specs["gpu/0"].column("power_w").units == "W"
    assert source.attrs["driver_version"] == "550.90.07"
    assert source.attrs["gpu_uuids"][1].startswith("GPU-")


def test_nvml_sample_converts_units_and_computes_rates():
    fake = FakeNvml(count=2)
    source = NvmlSource(fake, interval_s=1.0)
    source.sample(100.0)
    rows = source.sample(101.0)
    g0 = rows["gpu/0"]
    assert g0["power_w"] == pytest.approx(652.311)
    assert g0["memory_total_bytes"] == 85520809984
    assert g0["clock_sm_mhz"] == 1980
    assert g0["temperature_memory_c"] == 71
    assert g0["nvlink_tx_bytes_per_s"] == pytest.approx(150e9, rel=0.01)  # KiB counters -> B/s
    assert g0["gpm_sm_activity_pct"] == pytest.approx(81.5)
    assert rows["gpu/1"]["clock_event_reasons"] == 0x4


def test_nvml_xid_errors_become_node_events():
    fake = FakeNvml(count=2)
    source = NvmlSource(fake)
    fake.pending_xids = [(1, 79)]  # "GPU has fallen off the bus"
    events = source.events(5.0)
    assert events == [{"name": "xid", "start": 5.0, "end": 5.0, "attrs": {"gpu": 1, "xid": 79}}]
    assert source.events(6.0) == []


def test_an_xid_flood_is_drained_a_bounded_batch_per_call():
    fake = FakeNvml(count=1)
    source = NvmlSource(fake)
    fake.pending_xids = [(0, 13)] * (XID_DRAIN_MAX + 6)
    assert len(source.events(1.0)) == XID_DRAIN_MAX  # the sampler is not held up
    assert len(source.events(2.0)) == 6


def test_without_pcie_byte_counters_pcie_throughput_is_read_at_intervals_of_a_second():
    fake = FakeNvml(count=1, pcie_byte_counters=False)
    source = NvmlSource(fake, interval_s=1.0)
    (spec,) = source.specs()
    assert any(u.startswith("pcie_tx_bytes (field 197") for u in spec.attrs["unsupported"])
    assert source.sample(1.0)["gpu/0"]["pcie_tx_bytes_per_s"] == pytest.approx(3e9, rel=1e-6)
    # The fallback call samples for 20 ms: too slow to make ten times a second.
    (fast,) = NvmlSource(fake, interval_s=0.1).specs()
    assert "pcie_tx_bytes_per_s" not in [c.name for c in fast.columns]


def test_nvml_absent_says_why():
    source = NvmlSource(FakeNvml(fail_init=True))
    assert source.absent_reason.startswith("NVML unavailable")
    assert source.specs() == []


def test_gpm_off_leaves_gpm_columns_out():
    source = NvmlSource(FakeNvml(count=1), gpm=False)
    names = [c.name for c in source.specs()[0].columns]
    assert not any(n.startswith("gpm_") for n in names)


def test_infiniband_counts_bytes_from_4_byte_words(tmp_path):
    root = make_mlx5_tree(tmp_path / "infiniband")
    source = InfinibandSource(root)
    assert source.absent_reason is None
    specs = {s.path: s for s in source.specs()}
    assert sorted(specs) == ["ib/mlx5_0_1", "ib/mlx5_1_1"]
    assert specs["ib/mlx5_0_1"].attrs["link_layer"] == "InfiniBand"
    first = source.sample(10.0)["ib/mlx5_0_1"]
    assert first["xmit_bytes"] == 4 * 2_811_004_219_311
    assert np.isnan(first["xmit_bytes_per_s"])
    advance_counters(root, "mlx5_0", xmit_words=5_000_000_000, rcv_words=2_500_000_000, wait=1000)
    second = source.sample(12.0)["ib/mlx5_0_1"]
    assert second["xmit_bytes_per_s"] == pytest.approx(4 * 5e9 / 2)  # 10 GB/s
    assert second["rcv_bytes_per_s"] == pytest.approx(4 * 2.5e9 / 2)
    assert second["xmit_wait_per_s"] == pytest.approx(500)


def test_infiniband_absent_root_says_why(tmp_path):
    source = InfinibandSource(tmp_path / "nope")
    assert "does not exist" in source.absent_reason
    assert source.specs() == []


def test_host_source_reports_cpu_memory_and_interfaces():
    source = HostSource()
    source.sample(1.0)
    rows = source.sample(2.0)
    host = rows["host"]
    assert host["mem_total_bytes"] > 0 and 0 <= host["cpu_pct"] <= 100
    assert any(path.startswith("host/net/") for path in rows)
    assert {s.path for s in source.specs()} >= set(rows)


class FlakyNvml(FakeNvml):
    """Utilization reads start failing after the probe (a GPU that stops answering)."""

    def __init__(self) -> None:
        super().__init__(count=1)
        self.utilization_calls = 0

    def nvmlDeviceGetUtilizationRates(self, h: int):
        self.utilization_calls += 1
        if self.utilization_calls > 2:  # probe and column discovery succeed
            raise self.NVMLError("Unknown Error")
        return super().nvmlDeviceGetUtilizationRates(h)


def test_a_failing_nvml_call_leaves_a_gap_and_the_other_metrics_flow():
    source = NvmlSource(FlakyNvml())
    assert "utilization_gpu_pct" in [c.name for c in source.specs()[0].columns]
    row = source.sample(1.0)["gpu/0"]
    assert "utilization_gpu_pct" not in row  # written as NaN by the writer
    assert row["power_w"] == pytest.approx(652.311)
