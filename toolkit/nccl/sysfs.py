"""Read the node's network and PCI topology from sysfs (read-only, never raises on odd trees).

Everything is read under a root directory (`nccl.sysfs_root`, "/" on a real node) so tests
can point it at a recorded tree:
  sys/class/infiniband/<dev>/ports/<p>/{state,link_layer,rate,gids/<i>,gid_attrs/types/<i>}
  sys/class/infiniband/<dev>/device -> the PCI function (numa_node, path in sys/devices)
  sys/class/net/<iface>/{operstate,type,speed,device}
  sys/bus/pci/devices/<addr>/{vendor,class,numa_node}
  proc/net/route (the default route's interface)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller (class code prefix)
ARPHRD_LOOPBACK = 772
VIRTUAL_PREFIXES = ("docker", "veth", "virbr", "br-", "cni", "flannel", "cali", "tun", "tap")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Gid:
    index: int
    value: str  # "0000:0000:0000:0000:0000:ffff:0a00:0001"
    kind: str  # "IB/RoCE v1" | "RoCE v2" | "" (InfiniBand link layer: no type file)
    netdev: str | None = None

    @property
    def is_ipv4(self) -> bool:
        """An IPv4-mapped address (::ffff:a.b.c.d), the usual RoCE v2 choice."""
        return self.value.startswith("0000:0000:0000:0000:0000:ffff:")

    @property
    def is_roce_v2(self) -> bool:
        return self.kind.strip().lower() == "roce v2"


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", ... (the text after "4: ")
    link_layer: str  # "InfiniBand" | "Ethernet"
    rate_gbps: float
    gids: tuple[Gid, ...] = ()

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class PciDevice:
    address: str  # "0000:17:00.0"
    path: tuple[str, ...]  # components below sys/devices, root complex first
    numa_node: int


@dataclass(frozen=True)
class NetIface:
    name: str
    up: bool
    arp_type: int
    speed_mbps: int | None
    physical: bool  # has a device link (not a bridge/veth/loopback)

    @property
    def is_loopback(self) -> bool:
        return self.arp_type == ARPHRD_LOOPBACK or self.name == "lo"

    @property
    def is_virtual(self) -> bool:
        return not self.physical or self.name.startswith(VIRTUAL_PREFIXES)


@dataclass
class NodeTopology:
    ib_ports: list[IbPort] = field(default_factory=list)
    hca_pci: dict[str, PciDevice] = field(default_factory=dict)  # device name -> PCI
    gpus: list[PciDevice] = field(default_factory=list)  # sorted by PCI address
    interfaces: list[NetIface] = field(default_factory=list)
    default_route_iface: str | None = None

    @property
    def ib_devices(self) -> list[str]:
        return sorted({p.device for p in self.ib_ports})

    def active_ports(self, link_layer: str) -> list[IbPort]:
        return [p for p in self.ib_ports if p.active and p.link_layer == link_layer]

    def iface(self, name: str) -> NetIface | None:
        return next((i for i in self.interfaces if i.name == name), None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None, default: int | None = None) -> int | None:
    try:
        return int(text, 0) if text is not None else default
    except ValueError:
        return default


def _rate_gbps(text: str | None) -> float:
    """ "200 Gb/sec (4X HDR)" -> 200.0"""
    try:
        return float((text or "0").split()[0])
    except ValueError:
        return 0.0


def _pci(device_link: Path, root: Path) -> PciDevice | None:
    """The PCI function a sysfs `device` link points to, with its path below sys/devices."""
    try:
        real = Path(os.path.realpath(device_link))
        rel = real.relative_to(Path(os.path.realpath(root / "sys" / "devices")))
    except (OSError, ValueError):
        return None
    numa = _int(_read(real / "numa_node"), -1)
    return PciDevice(address=real.name, path=rel.parts, numa_node=numa if numa is not None else -1)


def _gids(port_dir: Path) -> tuple[Gid, ...]:
    gids = []
    gid_dir = port_dir / "gids"
    if not gid_dir.is_dir():
        return ()
    for entry in sorted(gid_dir.iterdir(), key=lambda p: _int(p.name, 1 << 30) or 0):
        index = _int(entry.name)
        value = _read(entry)
        if index is None or not value or value == ZERO_GID:
            continue
        kind = _read(port_dir / "gid_attrs" / "types" / entry.name) or ""
        netdev = _read(port_dir / "gid_attrs" / "ndevs" / entry.name)
        gids.append(Gid(index=index, value=value, kind=kind, netdev=netdev))
    return tuple(gids)


def _ib(root: Path, topo: NodeTopology) -> None:
    base = root / "sys" / "class" / "infiniband"
    if not base.is_dir():
        return
    for dev in sorted(base.iterdir()):
        pci = _pci(dev / "device", root)
        if pci is not None:
            topo.hca_pci[dev.name] = pci
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port_dir in sorted(ports.iterdir(), key=lambda p: _int(p.name, 0) or 0):
            number = _int(port_dir.name)
            if number is None:
                continue
            state = (_read(port_dir / "state") or "").split(":")[-1].strip()
            topo.ib_ports.append(
                IbPort(
                    device=dev.name,
                    port=number,
                    state=state,
                    link_layer=_read(port_dir / "link_layer") or "InfiniBand",
                    rate_gbps=_rate_gbps(_read(port_dir / "rate")),
                    gids=_gids(port_dir),
                )
            )


def _gpus(root: Path, topo: NodeTopology) -> None:
    base = root / "sys" / "bus" / "pci" / "devices"
    if not base.is_dir():
        return
    for dev in sorted(base.iterdir()):
        if _read(dev / "vendor") != NVIDIA_VENDOR:
            continue
        if not (_read(dev / "class") or "").startswith(GPU_CLASSES):
            continue
        pci = _pci(dev, root)
        if pci is not None:
            topo.gpus.append(pci)


def _net(root: Path, topo: NodeTopology) -> None:
    base = root / "sys" / "class" / "net"
    if not base.is_dir():
        return
    for dev in sorted(base.iterdir()):
        speed = _int(_read(dev / "speed"))
        topo.interfaces.append(
            NetIface(
                name=dev.name,
                up=(_read(dev / "operstate") or "").lower() in ("up", "unknown"),
                arp_type=_int(_read(dev / "type"), 0) or 0,
                speed_mbps=speed if speed is not None and speed > 0 else None,
                physical=(dev / "device").exists(),
            )
        )
    route = _read(root / "proc" / "net" / "route")
    for line in (route or "").splitlines()[1:]:
        cols = line.split()
        if len(cols) > 1 and cols[1] == "00000000":
            topo.default_route_iface = cols[0]
            break


def scan(root: str | os.PathLike = "/") -> NodeTopology:
    """Everything detection needs, read once; missing parts leave empty lists."""
    base = Path(root)
    topo = NodeTopology()
    _ib(base, topo)
    _gpus(base, topo)
    _net(base, topo)
    return topo


def pci_distance(a: PciDevice, b: PciDevice) -> str:
    """NVIDIA's topology classes from PCI paths (as in `nvidia-smi topo -m`):
    PIX one PCIe switch between them, PXB several switches (same root port), PHB through the
    host bridge (same root complex), NODE different root complexes on one NUMA node, SYS across
    NUMA nodes. An approximation from sysfs paths; NCCL computes its own at init."""
    common = 0
    for x, y in zip(a.path, b.path, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        same_numa = a.numa_node == b.numa_node and a.numa_node >= 0
        return "NODE" if same_numa else "SYS"
    if common == 1:
        return "PHB"
    hops = max(len(a.path) - common, len(b.path) - common)
    return "PIX" if hops <= 2 else "PXB"


DISTANCE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")
