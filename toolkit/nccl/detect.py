"""Pick NCCL settings for this node from its topology, with one reason per decision.

Pure: takes a `NodeTopology` (toolkit.nccl.sysfs.scan) and returns `Decision`s; nothing is
read or set here. A decision with value None means "left to NCCL" and is logged as such.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from toolkit.nccl.sysfs import DISTANCE_ORDER, IbPort, NetIface, NodeTopology, pci_distance

# The static tuning of each fabric. conf/nccl/<fabric>.yaml repeats it as `profile_env`, with a
# comment per variable (tests/nccl/test_profiles.py keeps the two equal).
FABRIC_TUNING: dict[str, dict[str, str]] = {
    "infiniband": {"NCCL_IB_DISABLE": "0", "NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7"},
    "roce": {"NCCL_IB_DISABLE": "0", "NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7"},
    "ethernet": {
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "4",
    },
    "single_node": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"},
}


@dataclass(frozen=True)
class Decision:
    name: str  # variable, or "fabric"
    value: str | None  # None: left to NCCL
    reason: str

    def line(self) -> str:
        shown = "(left to NCCL)" if self.value is None else self.value
        return f"{self.name}={shown}: {self.reason}"


def detect_fabric(topo: NodeTopology, num_nodes: int) -> Decision:
    """InfiniBand > RoCE > Ethernet; a one-node job needs no network at all."""
    if num_nodes == 1:
        return Decision(
            "fabric", "single_node", "1 node: NCCL uses NVLink/PCIe/shared memory, no network"
        )
    ib = topo.active_ports("InfiniBand")
    if ib:
        names = ", ".join(f"{p.name} {p.rate_gbps:g} Gb/s" for p in ib)
        return Decision("fabric", "infiniband", f"ACTIVE InfiniBand ports: {names}")
    roce = [p for p in topo.active_ports("Ethernet") if any(g.is_roce_v2 for g in p.gids)]
    if roce:
        names = ", ".join(f"{p.name} {p.rate_gbps:g} Gb/s" for p in roce)
        return Decision(
            "fabric", "roce", f"ACTIVE Ethernet-link-layer RDMA ports with RoCE v2 GIDs: {names}"
        )
    down = [p.name for p in topo.ib_ports if not p.active]
    why = f"RDMA ports present but not usable ({', '.join(down)})" if down else "no RDMA devices"
    return Decision("fabric", "ethernet", f"{why}; TCP sockets")


def fabric_ports(topo: NodeTopology, fabric: str) -> list[IbPort]:
    if fabric == "infiniband":
        return topo.active_ports("InfiniBand")
    if fabric == "roce":
        return [p for p in topo.active_ports("Ethernet") if any(g.is_roce_v2 for g in p.gids)]
    return []


def pick_hca(ports: list[IbPort]) -> Decision:
    value = ",".join(p.name for p in ports)
    return Decision(
        "NCCL_IB_HCA", f"={value}", f"the {len(ports)} active port(s) of the fabric, exact names"
    )


def pick_gid_index(ports: list[IbPort]) -> Decision:
    """The RoCE v2 GID with an IPv4-mapped address, the same index on every port if possible."""
    candidates = Counter(g.index for p in ports for g in p.gids if g.is_roce_v2 and g.is_ipv4)
    if not candidates:
        candidates = Counter(g.index for p in ports for g in p.gids if g.is_roce_v2)
        kind = "RoCE v2 (IPv6 only)"
    else:
        kind = "RoCE v2 + IPv4"
    if not candidates:
        return Decision("NCCL_IB_GID_INDEX", None, "no RoCE v2 GID found; NCCL picks")
    index, count = candidates.most_common(1)[0]
    note = "" if count == len(ports) else f" (on {count} of {len(ports)} ports; others differ)"
    return Decision("NCCL_IB_GID_INDEX", str(index), f"{kind} GID index{note}")


def pick_socket_ifname(topo: NodeTopology) -> Decision:
    """The default route's interface when it is up, else the fastest physical interface up."""
    route = topo.iface(topo.default_route_iface) if topo.default_route_iface else None
    if route is not None and route.up and not route.is_loopback:
        return Decision("NCCL_SOCKET_IFNAME", f"={route.name}", "carries the default route")
    usable: list[NetIface] = [
        i for i in topo.interfaces if i.up and not i.is_loopback and not i.is_virtual
    ]
    if not usable:
        return Decision(
            "NCCL_SOCKET_IFNAME", None, "no physical interface up; NCCL picks (excludes lo/docker)"
        )
    best = max(usable, key=lambda i: (i.speed_mbps or 0, i.arp_type == 32, i.name))
    speed = f"{best.speed_mbps} Mb/s" if best.speed_mbps else "speed unknown"
    return Decision(
        "NCCL_SOCKET_IFNAME", f"={best.name}", f"fastest physical interface up ({speed})"
    )


def _best_distances(topo: NodeTopology, ports: list[IbPort]) -> dict[str, tuple[str, str]]:
    """GPU address -> (closest HCA, distance class)."""
    hcas = {p.device: topo.hca_pci[p.device] for p in ports if p.device in topo.hca_pci}
    best: dict[str, tuple[str, str]] = {}
    for gpu in topo.gpus:
        ranked = sorted(
            ((DISTANCE_ORDER.index(pci_distance(gpu, pci)), name) for name, pci in hcas.items()),
        )
        if ranked:
            level, name = ranked[0]
            best[gpu.address] = (name, DISTANCE_ORDER[level])
    return best


def pick_gdr_and_rails(topo: NodeTopology, ports: list[IbPort]) -> list[Decision]:
    """GPUDirect RDMA level and NIC rails from GPU<->HCA PCI distances."""
    if not topo.gpus:
        reason = "no NVIDIA GPUs in the PCI tree"
        return [
            Decision("NCCL_NET_GDR_LEVEL", None, reason),
            Decision("NCCL_CROSS_NIC", None, reason),
        ]
    best = _best_distances(topo, ports)
    if not best:
        reason = "HCAs have no PCI location in sysfs"
        return [
            Decision("NCCL_NET_GDR_LEVEL", None, reason),
            Decision("NCCL_CROSS_NIC", None, reason),
        ]
    worst = max((d for _, d in best.values()), key=DISTANCE_ORDER.index)
    pairs = ", ".join(f"{gpu}->{hca} {d}" for gpu, (hca, d) in sorted(best.items()))
    if DISTANCE_ORDER.index(worst) <= DISTANCE_ORDER.index("PXB"):
        gdr = Decision(
            "NCCL_NET_GDR_LEVEL", "PXB", f"every GPU shares a PCIe switch with an HCA ({pairs})"
        )
    else:
        gdr = Decision(
            "NCCL_NET_GDR_LEVEL",
            None,
            f"a GPU reaches its closest HCA only via {worst} ({pairs}); GPUDirect RDMA there is slow",
        )
    closest = [hca for hca, d in best.values() if DISTANCE_ORDER.index(d) <= 1]
    one_to_one = len(closest) == len(topo.gpus) and len(set(closest)) == len(closest)
    if one_to_one:
        cross = Decision(
            "NCCL_CROSS_NIC",
            "0",
            "one HCA per GPU under a shared PCIe switch: rail-optimised, keep rings on their rail",
        )
    else:
        cross = Decision("NCCL_CROSS_NIC", None, "GPUs and HCAs do not pair one to one")
    return [gdr, cross]


def plan(topo: NodeTopology, profile: str, num_nodes: int) -> tuple[str, list[Decision]]:
    """(fabric, decisions) for a profile: `auto` detects the fabric and applies its tuning;
    a network profile forces its fabric and detects only the node-specific values."""
    decisions: list[Decision] = []
    if profile == "auto":
        fabric_decision = detect_fabric(topo, num_nodes)
        fabric = str(fabric_decision.value)
        decisions.append(fabric_decision)
        decisions += [
            Decision(name, value, f"{fabric} tuning (conf/nccl/{fabric}.yaml)")
            for name, value in FABRIC_TUNING[fabric].items()
        ]
    else:
        fabric = profile
        decisions.append(Decision("fabric", fabric, f"nccl={profile}"))
    if fabric in ("infiniband", "roce"):
        ports = fabric_ports(topo, fabric)
        if ports:
            decisions.append(pick_hca(ports))
            if fabric == "roce":
                decisions.append(pick_gid_index(ports))
            decisions += pick_gdr_and_rails(topo, ports)
    if fabric in ("infiniband", "roce", "ethernet"):
        decisions.append(pick_socket_ifname(topo))
    return fabric, decisions
