"""Launcher-level validation: bad values, contradictions and typos, before any rank starts."""

import pytest

from toolkit.launch import main as launch


def run_launcher(capsys, *overrides):
    code = launch(["--cfg", "job", *overrides])
    return code, capsys.readouterr().err


def test_ib_disabled_contradicts_the_infiniband_profile(capsys):
    code, err = run_launcher(capsys, "nccl=infiniband", "nccl.env.NCCL_IB_DISABLE=1")
    assert code == 2
    assert "error: nccl.env.NCCL_IB_DISABLE=1: contradicts nccl=infiniband" in err


def test_a_preset_environment_variable_is_checked_too(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    code, err = run_launcher(capsys, "nccl=roce")
    assert code == 2
    assert "environment.NCCL_IB_DISABLE=1: contradicts nccl=roce" in err


def test_hca_list_with_ethernet_profile_has_no_effect(capsys):
    code, err = run_launcher(capsys, "nccl=ethernet", "nccl.env.NCCL_IB_HCA=mlx5_0")
    assert code == 2
    assert (
        "nccl.env.NCCL_IB_HCA=mlx5_0: has no effect with NCCL_IB_DISABLE=1 (nccl=ethernet)" in err
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("nccl.env.NCCL_IB_TIMEOUT=40", "nccl.env.NCCL_IB_TIMEOUT=40: must be in 1..31"),
        (
            "nccl.env.NCCL_NET_GDR_LEVEL=FAR",
            "nccl.env.NCCL_NET_GDR_LEVEL=FAR: allowed: LOC, PIX, PXB",
        ),
        (
            "nccl.env.NCCL_PROTO=LL256",
            "nccl.env.NCCL_PROTO=LL256: unknown LL256; allowed: LL, LL128, Simple",
        ),
        ("nccl.env.NCCL_BUFFSIZE=4M", "nccl.env.NCCL_BUFFSIZE=4M: must be an integer >= 1"),
        ("nccl.debug=LOUD", "nccl.debug=LOUD: allowed: VERSION, WARN, INFO, TRACE, ABORT or null"),
        (
            "nccl.profile=infiniband_hdr",
            "nccl.profile=infiniband_hdr: unknown profile; allowed: auto",
        ),
    ],
)
def test_bad_values_name_the_field_the_value_and_what_is_allowed(capsys, override, message):
    code, err = run_launcher(capsys, override)
    assert code == 2
    assert message in err


def test_min_ctas_above_max_ctas(capsys):
    code, err = run_launcher(capsys, "nccl.env.NCCL_MIN_CTAS=16", "nccl.env.NCCL_MAX_CTAS=8")
    assert code == 2
    assert "NCCL_MIN_CTAS=16 > NCCL_MAX_CTAS=8" in err


def test_single_node_profile_on_two_nodes_is_rejected(capsys):
    code, err = run_launcher(capsys, "nccl=single_node", "cluster.nodes=2", "cluster.kind=slurm")
    assert "nccl=single_node: for one node, but cluster.nodes=2" in err


def test_typo_warns_with_the_closest_known_name_and_still_launches(capsys):
    code, err = run_launcher(
        capsys, "nccl.env.NCCL_IB_HCAS=mlx5_0", "nccl.env.NCCL_SOCKET_IFNAM=eth0"
    )
    assert code == 0
    assert (
        "warning: nccl: NCCL_IB_HCAS: not a known NCCL/PyTorch variable; did you mean NCCL_IB_HCA?"
        in err
    )
    assert "did you mean NCCL_SOCKET_IFNAME?" in err


def test_user_override_key_can_be_added_without_a_plus(capsys):
    code = launch(
        ["--cfg", "job", "nccl.env.NCCL_BUFFSIZE=8388608", "nccl.env={NCCL_IB_HCA: mlx5_1}"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "NCCL_BUFFSIZE: '8388608'" in out and "NCCL_IB_HCA: mlx5_1" in out


def test_benchmark_config_is_validated(capsys):
    code, err = run_launcher(
        capsys,
        "task=bench_collectives",
        "collectives.ops=[all_reduce,gather]",
        "collectives.redop=avg",
        "collectives.dtype=int32",
    )
    assert code == 2
    assert "collectives.ops=['all_reduce', 'gather']: unknown or empty; allowed: all_reduce" in err
    assert "collectives.redop=avg: needs a floating dtype, not collectives.dtype=int32" in err
