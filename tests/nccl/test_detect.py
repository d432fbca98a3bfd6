"""Fabric auto-detection on recorded sysfs trees picks the expected variables."""

from toolkit.nccl.detect import FABRIC_TUNING, plan
from toolkit.nccl.sysfs import pci_distance, scan


def values(decisions):
    return {d.name: d.value for d in decisions}


def test_scan_reads_ports_gids_gpus_and_interfaces(ib_root):
    topo = scan(ib_root)
    assert topo.ib_devices == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"]
    port = topo.ib_ports[0]
    assert (port.name, port.state, port.link_layer, port.rate_gbps) == (
        "mlx5_0:1",
        "ACTIVE",
        "InfiniBand",
        400.0,
    )
    assert [g.address for g in topo.gpus] == [
        "0000:18:00.0",
        "0000:38:00.0",
        "0000:9d:00.0",
        "0000:bd:00.0",
    ]
    assert topo.default_route_iface == "eno1"
    assert topo.iface("ib0").arp_type == 32 and topo.iface("docker0").is_virtual


def test_pci_distance_classes(ib_root):
    topo = scan(ib_root)
    gpu0, gpu2 = topo.gpus[0], topo.gpus[2]
    assert pci_distance(gpu0, topo.hca_pci["mlx5_0"]) == "PIX"  # same PCIe switch
    assert pci_distance(gpu0, topo.hca_pci["mlx5_1"]) == "NODE"  # other root complex, same NUMA
    assert pci_distance(gpu0, topo.hca_pci["mlx5_2"]) == "SYS"  # across NUMA nodes
    assert pci_distance(gpu2, topo.hca_pci["mlx5_2"]) == "PIX"


def test_infiniband_node_uses_the_four_ib_hcas_with_gdr_and_rails(ib_root):
    fabric, decisions = plan(scan(ib_root), "auto", num_nodes=2)
    v = values(decisions)
    assert fabric == "infiniband"
    assert (
        v["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    )  # not the RoCE front-end mlx5_4
    assert v["NCCL_NET_GDR_LEVEL"] == "PXB"
    assert v["NCCL_CROSS_NIC"] == "0"
    assert v["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert v["NCCL_IB_DISABLE"] == "0" and v["NCCL_IB_TIMEOUT"] == "22"
    assert "NCCL_IB_GID_INDEX" not in v  # InfiniBand link layer: no GID selection
    assert all(d.reason for d in decisions)  # every decision says why


def test_roce_node_picks_the_roce_v2_ipv4_gid(roce_root):
    fabric, decisions = plan(scan(roce_root), "auto", num_nodes=4)
    v = values(decisions)
    assert fabric == "roce"
    assert v["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert v["NCCL_IB_GID_INDEX"] == "3"
    assert v["NCCL_NET_GDR_LEVEL"] == "PXB"
    assert v["NCCL_SOCKET_IFNAME"] == "=eno1"


def test_ethernet_node_disables_ib_and_uses_the_default_route_interface(eth_root):
    fabric, decisions = plan(scan(eth_root), "auto", num_nodes=2)
    v = values(decisions)
    assert fabric == "ethernet"
    assert v["NCCL_IB_DISABLE"] == "1"
    assert v["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert v["NCCL_SOCKET_NTHREADS"] == "4" and v["NCCL_NSOCKS_PERTHREAD"] == "4"
    assert "NCCL_IB_HCA" not in v


def test_ib_ports_down_fall_back_to_ethernet_and_say_so(ib_down_root):
    fabric, decisions = plan(scan(ib_down_root), "auto", num_nodes=2)
    # mlx5_4 (RoCE, ACTIVE) remains: the node still has RDMA over Ethernet
    assert fabric == "roce"
    assert values(decisions)["NCCL_IB_HCA"] == "=mlx5_4:1"


def test_one_node_needs_no_network(ib_root):
    fabric, decisions = plan(scan(ib_root), "auto", num_nodes=1)
    assert fabric == "single_node"
    assert values(decisions) == {"fabric": "single_node", **FABRIC_TUNING["single_node"]}


def test_forced_profile_detects_only_node_specific_values(roce_root):
    fabric, decisions = plan(scan(roce_root), "roce", num_nodes=2)
    v = values(decisions)
    assert fabric == "roce" and "NCCL_IB_TIMEOUT" not in v  # static values come from the YAML
    assert v["NCCL_IB_GID_INDEX"] == "3"


def test_a_missing_sysfs_tree_means_ethernet_with_nccl_choosing_the_interface(tmp_path):
    fabric, decisions = plan(scan(tmp_path / "nothing"), "auto", num_nodes=2)
    assert fabric == "ethernet"
    assert values(decisions)["NCCL_SOCKET_IFNAME"] is None
