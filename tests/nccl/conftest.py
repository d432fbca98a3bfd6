"""Fixtures: recorded-style sysfs trees of an InfiniBand, a RoCE and an Ethernet-only node."""

from __future__ import annotations

import pytest

from tests.nccl import sysfs_trees


@pytest.fixture
def ib_root(tmp_path):
    return sysfs_trees.infiniband_node(tmp_path / "ib")


@pytest.fixture
def ib_down_root(tmp_path):
    return sysfs_trees.infiniband_node(tmp_path / "ibdown", ports_state="1: DOWN")


@pytest.fixture
def roce_root(tmp_path):
    return sysfs_trees.roce_node(tmp_path / "roce")


@pytest.fixture
def eth_root(tmp_path):
    return sysfs_trees.ethernet_node(tmp_path / "eth")


@pytest.fixture(autouse=True)
def _no_shell_nccl_variables(clean_nccl_environment):
    """Every test here runs without the NCCL variables of the shell (tests/conftest.py)."""
