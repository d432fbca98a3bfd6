"""Fixtures: recorded-style sysfs trees of an InfiniBand, a RoCE and an Ethernet-only node."""

from __future__ import annotations

import os

import pytest

from tests.nccl import sysfs_trees
from toolkit.nccl.known import is_nccl_family


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
def clean_nccl_environment(monkeypatch):
    """Tests must not see (or leak) NCCL variables of the shell that runs them."""
    for name in list(os.environ):
        if is_nccl_family(name):
            monkeypatch.delenv(name)
