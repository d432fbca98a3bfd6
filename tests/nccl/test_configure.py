"""Node-level setup in every rank: layering and precedence, the run-dir record, node checks."""

import json
import re
import socket

import pytest

from tests.nccl.cli import run_module
from toolkit.config.nccl import NcclConfig
from toolkit.distributed.env import DistEnv
from toolkit.nccl import NcclSetupError, configure, effective_env

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)


def dist_env(rank=0, local_rank=0, node_rank=0, num_nodes=2):
    return DistEnv(rank, local_rank, 8 * num_nodes, 8, node_rank, num_nodes, "127.0.0.1", 29500)


def test_auto_on_an_ib_node_exports_detected_and_toolkit_variables(ib_root, tmp_path):
    environ = {}
    cfg = NcclConfig(sysfs_root=str(ib_root))
    setup = configure(cfg, dist_env(rank=3, local_rank=3), tmp_path, environ)
    assert setup.fabric == "infiniband"
    assert environ["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert environ["NCCL_DEBUG"] == "WARN"
    assert environ["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl/debug-rank3.%h.%p.log"
    assert environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert environ["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/nccl/flight_recorder/rank_"
    pipe = f"{tmp_path}/nccl/flight_recorder/pipe_rank_"  # the hang watchdog's on-demand dump
    assert environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == pipe


def test_precedence_detected_then_profile_then_environment_then_config(ib_root, tmp_path):
    environ = {"NCCL_IB_HCA": "=mlx5_1", "NCCL_IB_TIMEOUT": "20", "NCCL_DEBUG": "INFO"}
    cfg = NcclConfig(
        profile="infiniband",
        profile_env={"NCCL_IB_DISABLE": "0", "NCCL_IB_TIMEOUT": "22"},
        env={"NCCL_DEBUG": "TRACE"},
        sysfs_root=str(ib_root),
    )
    setup = configure(cfg, dist_env(), tmp_path, environ)
    s = setup.settings
    assert (s["NCCL_IB_HCA"].value, s["NCCL_IB_HCA"].source) == ("=mlx5_1", "environment")
    assert s["NCCL_IB_HCA"].replaced == (("detected", "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"),)
    assert (s["NCCL_IB_TIMEOUT"].value, s["NCCL_IB_TIMEOUT"].source) == ("20", "environment")
    assert (s["NCCL_DEBUG"].value, s["NCCL_DEBUG"].source) == ("TRACE", "config")
    assert environ["NCCL_DEBUG"] == "TRACE"


def test_local_rank_0_records_the_node_environment_in_the_run_dir(eth_root, tmp_path):
    environ = {}
    configure(
        NcclConfig(sysfs_root=str(eth_root)), dist_env(node_rank=1, rank=8), tmp_path, environ
    )
    record = json.loads((tmp_path / "nccl-env-node1.json").read_text())
    assert record["fabric"] == "ethernet"
    assert record["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert record["sources"]["NCCL_SOCKET_IFNAME"] == "detected"
    assert any(
        line.startswith("NCCL_SOCKET_IFNAME==eth0: carries the default route")
        for line in record["decisions"]
    )
    assert effective_env(environ) == record["env"]


def test_other_local_ranks_do_not_rewrite_the_record(eth_root, tmp_path):
    configure(NcclConfig(sysfs_root=str(eth_root)), dist_env(rank=1, local_rank=1), tmp_path, {})
    assert not (tmp_path / "nccl-env-node0.json").exists()


def test_effective_env_keeps_only_nccl_and_torch_nccl_variables():
    environ = {
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_BUFFER_SIZE": "10",
        "PATH": "/bin",
    }
    assert effective_env(environ) == {
        "NCCL_DEBUG": "WARN",
        "TORCH_FR_BUFFER_SIZE": "10",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def test_hca_that_does_not_exist_fails_naming_rank_and_node(ib_root, tmp_path):
    cfg = NcclConfig(sysfs_root=str(ib_root), env={"NCCL_IB_HCA": "=mlx5_9"})
    with pytest.raises(NcclSetupError) as err:
        configure(cfg, dist_env(rank=9, node_rank=1), tmp_path, {})
    host = socket.gethostname()
    assert str(err.value) == (
        f"rank 9 on {host} (node 1): NCCL_IB_HCA==mlx5_9: no HCA named 'mlx5_9' on this node; "
        "present: mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4"
    )


def test_socket_interface_that_does_not_exist_fails(eth_root, tmp_path):
    cfg = NcclConfig(sysfs_root=str(eth_root), env={"NCCL_SOCKET_IFNAME": "=ens5"})
    with pytest.raises(
        NcclSetupError,
        match=r"NCCL_SOCKET_IFNAME==ens5: no interface matching ens5 on this node; present: docker0, eth0, lo",
    ):
        configure(cfg, dist_env(), tmp_path, {})


def test_infiniband_profile_on_a_node_without_active_ib_fails(ib_down_root, tmp_path):
    cfg = NcclConfig(
        profile="infiniband", profile_env={"NCCL_IB_DISABLE": "0"}, sysfs_root=str(ib_down_root)
    )
    with pytest.raises(
        NcclSetupError,
        match=r"nccl=infiniband: no ACTIVE InfiniBand-link-layer RDMA port on this node \(ports: mlx5_0:1 DOWN InfiniBand",
    ):
        configure(cfg, dist_env(), tmp_path, {})


def test_gid_index_missing_on_a_roce_port_lists_the_roce_v2_ones(roce_root, tmp_path):
    cfg = NcclConfig(sysfs_root=str(roce_root), env={"NCCL_IB_GID_INDEX": "7"})
    with pytest.raises(
        NcclSetupError, match="NCCL_IB_GID_INDEX=7: mlx5_0:1 has no GID 7; RoCE v2 GIDs: 1, 3"
    ):
        configure(cfg, dist_env(), tmp_path, {})


def test_preset_ib_disable_on_the_node_contradicts_roce(roce_root, tmp_path):
    cfg = NcclConfig(profile="roce", sysfs_root=str(roce_root))
    with pytest.raises(NcclSetupError, match="NCCL_IB_DISABLE=1 contradicts nccl=roce"):
        configure(cfg, dist_env(), tmp_path, {"NCCL_IB_DISABLE": "1"})


def test_flight_recorder_off_disables_the_dump(eth_root, tmp_path):
    environ = {}
    configure(
        NcclConfig(sysfs_root=str(eth_root), flight_recorder_entries=0),
        dist_env(),
        tmp_path,
        environ,
    )
    assert environ["TORCH_FR_BUFFER_SIZE"] == "0" and environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in environ
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in environ


@pytest.mark.slow
def test_the_entrypoint_stops_before_init_and_names_the_rank(tmp_path):
    """A real 2-rank launch with an HCA this machine lacks: exits non-zero, nothing trained."""
    run_dir = tmp_path / "run"
    proc = run_module(
        "toolkit.launch",
        "model=gpt_tiny",
        "trainer.steps=1",
        "nccl.env.NCCL_IB_HCA=mlx5_7",
        f"nccl.sysfs_root={tmp_path / 'no-rdma-node'}",  # the same answer on any machine
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode != 0
    assert re.search(r"NcclSetupError: rank [01] on \S+ \(node 0\): ", proc.stderr)
    assert (
        "NCCL_IB_HCA=mlx5_7: no HCA starting with 'mlx5_7' on this node; present: none"
        in proc.stderr
    )
    assert not list((run_dir / "metrics").glob("*"))  # nothing trained (the dir is made upfront)


def test_an_exact_hca_list_applies_to_every_entry(ib_root, tmp_path):
    # "=" makes the whole list exact: mlx5_1 exists, "mlx5_" alone names no device
    cfg = NcclConfig(sysfs_root=str(ib_root), env={"NCCL_IB_HCA": "=mlx5_1:1,mlx5_"})
    with pytest.raises(NcclSetupError, match="no HCA named 'mlx5_' on this node"):
        configure(cfg, dist_env(), tmp_path, {})
    prefix = NcclConfig(sysfs_root=str(ib_root), env={"NCCL_IB_HCA": "mlx5_1,mlx5_2:1"})
    assert configure(prefix, dist_env(), tmp_path, {}).settings["NCCL_IB_HCA"].source == "config"
