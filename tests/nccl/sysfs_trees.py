"""Realistic sysfs trees of three kinds of GPU node, written under a temporary root.

The layout is what the Linux kernel exposes (same file names and formats):
  sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/{vendor,class,numa_node}
  sys/bus/pci/devices/<addr> -> ../../../devices/...        (symlink)
  sys/class/infiniband/<hca>/device -> ../../../devices/... (symlink)
  sys/class/infiniband/<hca>/ports/1/{state,phys_state,link_layer,rate,gids/<i>,gid_attrs/types/<i>,gid_attrs/ndevs/<i>}
  sys/class/net/<iface>/{operstate,type,speed,device}
  proc/net/route
"""

from __future__ import annotations

import os
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"


class Tree:
    def __init__(self, root: Path):
        self.root = root

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def link(self, rel: str, target_rel: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(self.root / target_rel, path.parent), path)

    def pci(self, chain: list[str], numa: int, vendor: str, cls: str) -> str:
        """A PCI function at the end of `chain` (root complex first); returns its sys path."""
        rel = "sys/devices/" + "/".join(chain)
        self.write(f"{rel}/vendor", vendor)
        self.write(f"{rel}/class", cls)
        self.write(f"{rel}/numa_node", str(numa))
        self.link(f"sys/bus/pci/devices/{chain[-1]}", rel)
        return rel

    def gpu(self, chain: list[str], numa: int) -> None:
        self.pci(chain, numa, "0x10de", "0x030200")  # NVIDIA 3D controller

    def hca(
        self,
        name: str,
        chain: list[str],
        numa: int,
        link_layer: str,
        state: str = "4: ACTIVE",
        rate: str = "400 Gb/sec (4X NDR)",
        gids: list[tuple[str, str, str | None]] | None = None,
    ) -> None:
        rel = self.pci(chain, numa, "0x15b3", "0x020700")  # Mellanox InfiniBand controller
        base = f"sys/class/infiniband/{name}"
        self.link(f"{base}/device", rel)
        port = f"{base}/ports/1"
        self.write(f"{port}/state", state)
        self.write(f"{port}/phys_state", "5: LinkUp" if "ACTIVE" in state else "3: Disabled")
        self.write(f"{port}/link_layer", link_layer)
        self.write(f"{port}/rate", rate)
        entries = gids or [("fe80:0000:0000:0000:0a88:6603:00f3:1e2c", "", None)]
        for index, (value, kind, netdev) in enumerate(entries):
            self.write(f"{port}/gids/{index}", value)
            if kind:
                self.write(f"{port}/gid_attrs/types/{index}", kind)
            if netdev:
                self.write(f"{port}/gid_attrs/ndevs/{index}", netdev)
        self.write(f"{port}/gids/{len(entries)}", ZERO_GID)  # unused table slots read as zero

    def iface(
        self,
        name: str,
        arp_type: int = 1,
        speed: int | None = None,
        up: bool = True,
        device_rel: str | None = None,
    ) -> None:
        base = f"sys/class/net/{name}"
        self.write(f"{base}/operstate", "up" if up else "down")
        self.write(f"{base}/type", str(arp_type))
        if speed is not None:
            self.write(f"{base}/speed", str(speed))
        if device_rel:
            self.link(f"{base}/device", device_rel)

    def default_route(self, iface: str) -> None:
        self.write(
            "proc/net/route",
            f"{ROUTE_HEADER}\n{iface}\t00000000\t0102000A\t0003\t0\t0\t0\t00000000\t0\t0\t0",
        )


def _switch(root_complex: str, root_port: str, upstream: str) -> list[str]:
    return [root_complex, root_port, upstream]


def infiniband_node(root: Path, ports_state: str = "4: ACTIVE") -> Path:
    """DGX-like: 2 NUMA nodes, 4 GPUs, each sharing a PCIe switch with one NDR HCA
    (mlx5_0..3, InfiniBand), plus a front-end RoCE NIC (mlx5_4) and the usual interfaces."""
    t = Tree(root)
    layouts = [
        (
            "pci0000:15",
            "0000:15:01.0",
            "0000:16:00.0",
            "0000:17:00.0",
            "0000:18:00.0",
            "0000:17:01.0",
            "0000:19:00.0",
            0,
        ),
        (
            "pci0000:35",
            "0000:35:01.0",
            "0000:36:00.0",
            "0000:37:00.0",
            "0000:38:00.0",
            "0000:37:01.0",
            "0000:39:00.0",
            0,
        ),
        (
            "pci0000:9a",
            "0000:9a:01.0",
            "0000:9b:00.0",
            "0000:9c:00.0",
            "0000:9d:00.0",
            "0000:9c:01.0",
            "0000:9e:00.0",
            1,
        ),
        (
            "pci0000:ba",
            "0000:ba:01.0",
            "0000:bb:00.0",
            "0000:bc:00.0",
            "0000:bd:00.0",
            "0000:bc:01.0",
            "0000:be:00.0",
            1,
        ),
    ]
    for i, (rc, rp, up, gdown, gpu, ndown, nic, numa) in enumerate(layouts):
        sw = _switch(rc, rp, up)
        t.gpu([*sw, gdown, gpu], numa)
        t.hca(f"mlx5_{i}", [*sw, ndown, nic], numa, "InfiniBand", state=ports_state)
        t.iface(
            f"ib{i}",
            arp_type=32,
            up="ACTIVE" in ports_state,
            device_rel=f"sys/devices/{'/'.join([*sw, ndown, nic])}",
        )
    front = ["pci0000:00", "0000:00:1c.0", "0000:01:00.0"]
    t.hca(
        "mlx5_4",
        front,
        0,
        "Ethernet",
        rate="100 Gb/sec (4X EDR)",
        gids=[
            ("fe80:0000:0000:0000:0e42:a1ff:fe9b:0001", "IB/RoCE v1", "eno1"),
            ("fe80:0000:0000:0000:0e42:a1ff:fe9b:0001", "RoCE v2", "eno1"),
            ("0000:0000:0000:0000:0000:ffff:c0a8:0105", "IB/RoCE v1", "eno1"),
            ("0000:0000:0000:0000:0000:ffff:c0a8:0105", "RoCE v2", "eno1"),
        ],
    )
    t.iface("eno1", speed=100000, device_rel=f"sys/devices/{'/'.join(front)}")
    t.iface("docker0", speed=None)
    t.iface("lo", arp_type=772)
    t.default_route("eno1")
    return root


def roce_node(root: Path) -> Path:
    """2 GPUs, each beside a 200 GbE ConnectX (mlx5_0/1, link layer Ethernet) on one switch;
    GID 3 is RoCE v2 with an IPv4 address on both ports."""
    t = Tree(root)
    for i, (rc, numa) in enumerate([("pci0000:3a", 0), ("pci0000:d7", 1)]):
        bus = rc[-2:]
        sw = [rc, f"0000:{bus}:02.0", f"0000:{bus}:03.0"]
        t.gpu([*sw, f"0000:{bus}:04.0", f"0000:{bus}:05.0"], numa)
        netdev = f"ens{i + 1}f0np0"
        nic = [*sw, f"0000:{bus}:04.1", f"0000:{bus}:06.0"]
        t.hca(
            f"mlx5_{i}",
            nic,
            numa,
            "Ethernet",
            rate="200 Gb/sec (4X HDR)",
            gids=[
                (f"fe80:0000:0000:0000:ba3f:d2ff:fe1c:00{i}1", "IB/RoCE v1", netdev),
                (f"fe80:0000:0000:0000:ba3f:d2ff:fe1c:00{i}1", "RoCE v2", netdev),
                (f"0000:0000:0000:0000:0000:ffff:0a00:0{i}11", "IB/RoCE v1", netdev),
                (f"0000:0000:0000:0000:0000:ffff:0a00:0{i}11", "RoCE v2", netdev),
            ],
        )
        t.iface(netdev, speed=200000, device_rel=f"sys/devices/{'/'.join(nic)}")
    mgmt = ["pci0000:00", "0000:00:1c.0", "0000:02:00.0"]
    t.pci(mgmt, 0, "0x8086", "0x020000")
    t.iface("eno1", speed=10000, device_rel=f"sys/devices/{'/'.join(mgmt)}")
    t.iface("lo", arp_type=772)
    t.default_route("eno1")
    return root


def ethernet_node(root: Path) -> Path:
    """Cloud-style: 2 GPUs, one 100 GbE virtual NIC (eth0), no RDMA devices, a docker bridge."""
    t = Tree(root)
    t.gpu(["pci0000:00", "0000:00:04.0"], 0)
    t.gpu(["pci0000:00", "0000:00:05.0"], 0)
    nic = ["pci0000:00", "0000:00:06.0"]
    t.pci(nic, 0, "0x1d0f", "0x020000")
    t.iface("eth0", speed=100000, device_rel=f"sys/devices/{'/'.join(nic)}")
    t.iface("docker0")
    t.iface("lo", arp_type=772)
    t.default_route("eth0")
    return root
