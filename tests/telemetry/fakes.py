"""The only fakes these tests use: an object answering the NVML calls the sampler makes
(values as an H100 SXM node reports them under load), and an mlx5-like sysfs tree."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


def _field(value: float, ret: int = 0) -> SimpleNamespace:
    v = SimpleNamespace(
        dVal=float(value),
        uiVal=int(value),
        ulVal=int(value),
        ullVal=int(value),
        sllVal=int(value),
        siVal=int(value),
    )
    return SimpleNamespace(valueType=3, nvmlReturn=ret, value=v)


class _GpmRequest:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


class FakeNvml:
    """Two H100s. GPU 1 has no NVLink counters (a PCIe card would not). Counters advance by
    the amounts of one second at 650 W, 3 GB/s PCIe TX, 150 GB/s NVLink TX per read."""

    NVMLError = NVMLError
    nvmlEventTypeXidCriticalError = 8
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _GpmRequest

    def __init__(
        self,
        count: int = 2,
        fail_init: bool = False,
        gpm: bool = True,
        pcie_byte_counters: bool = True,
    ):
        self.count = count
        self.fail_init = fail_init
        self.gpm = gpm
        # False: a driver without the PCIe byte fields, only nvmlDeviceGetPcieThroughput.
        self.pcie_byte_counters = pcie_byte_counters
        self.reads: dict[int, int] = {}  # per GPU: energy reads so far (one per sample)
        self.pending_xids: list[tuple[int, int]] = []
        self.shut_down = False

    # -- system
    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.90.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    # -- static
    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-5e1f0c2a-8d7b-4f9e-a3c1-00000000000{h}"

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700000

    # -- dynamic
    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=97, memory=44)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=85520809984, used=76235669504, free=9285140480)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 652311

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self.reads[h] = self.reads.get(h, 0) + 1
        return 9_876_543_210 + 650_000 * self.reads[h]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 64 + h

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return {1: 1980, 2: 2619}[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x4 if h == 1 else 0x0  # GPU 1 at its software power cap

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return 0

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        raise NVMLError_NotSupported("Not Supported")  # Ampere+: row remapping instead

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)

    def nvmlDeviceGetFieldValues(self, h: int, fields: list) -> list[SimpleNamespace]:
        n = self.reads.get(h, 0)
        values = {
            82: lambda: _field(71 + h),  # memory temperature
            138: lambda: _field(150e9 / 1024 * n) if h == 0 else _field(0, ret=3),
            139: lambda: _field(148e9 / 1024 * n) if h == 0 else _field(0, ret=3),
            197: lambda: _field(3e9 * n) if self.pcie_byte_counters else _field(0, ret=3),
            198: lambda: _field(1.5e9 * n) if self.pcie_byte_counters else _field(0, ret=3),
        }
        return [values[f[0] if isinstance(f, tuple) else f]() for f in fields]

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        if self.pcie_byte_counters:
            raise NVMLError_NotSupported("Not Supported")
        return {0: 2_929_688, 1: 1_464_844}[counter]  # KB/s: 3 and 1.5 GB/s

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=1 if self.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        return SimpleNamespace()

    def nvmlGpmSampleGet(self, h: int, sample: SimpleNamespace) -> SimpleNamespace:
        return sample

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        pass

    def nvmlGpmMetricsGet(self, request: _GpmRequest) -> _GpmRequest:
        values = {2: 81.5, 3: 38.2, 5: 55.0, 10: 42.7}
        for m in request.metrics[: request.numMetrics]:
            m.value = values[m.metricId]
        return request

    # -- events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.pending_xids:
            raise NVMLError_Timeout("Timeout")
        gpu, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=gpu, eventType=8, eventData=xid)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


# Counter values read on a ConnectX-7 (mlx5) NDR port.
MLX5_COUNTERS = {
    "port_xmit_data": 2_811_004_219_311,
    "port_rcv_data": 2_790_511_330_004,
    "port_xmit_packets": 1_403_771_902,
    "port_rcv_packets": 1_399_002_116,
    "port_xmit_wait": 88_120_447,
    "port_xmit_discards": 0,
    "port_rcv_errors": 0,
    "symbol_error": 0,
    "link_downed": 1,
}


def make_mlx5_tree(root: Path, devices: tuple[str, ...] = ("mlx5_0", "mlx5_1")) -> Path:
    """A /sys/class/infiniband-like tree: <root>/<dev>/ports/1/{counters/*,state,rate,...}."""
    for dev in devices:
        port = root / dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        for name, value in MLX5_COUNTERS.items():
            (port / "counters" / name).write_text(f"{value}\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("InfiniBand\n")
    return root


def advance_counters(root: Path, dev: str, xmit_words: int, rcv_words: int, wait: int) -> None:
    counters = root / dev / "ports" / "1" / "counters"
    for name, delta in (
        ("port_xmit_data", xmit_words),
        ("port_rcv_data", rcv_words),
        ("port_xmit_wait", wait),
    ):
        path = counters / name
        path.write_text(f"{int(path.read_text()) + delta}\n")
