"""Tiny synthetic datasets (well under a megabyte) in each format."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from toolkit.config.data import DataConfig
from toolkit.data.synthetic import write_synthetic

NUM_TIMES = 1200
NUM_INSTRUMENTS = 6
CHUNK_LEN = 64  # several chunks and several part files (8 chunks each)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("datasets")
    return {
        fmt: (
            write_synthetic(root / fmt, NUM_TIMES, NUM_INSTRUMENTS, fmt, chunk_len=CHUNK_LEN)
            and root / fmt
        )
        for fmt in ("hdf5", "parquet", "npy")
    }


def config(path: Path, **overrides) -> DataConfig:
    """data=returns on `path`: a short lookback, a 2-step horizon, validation and test
    periods, loading in the test process unless num_workers says otherwise."""
    base = DataConfig(kind="returns", seq_len=16, horizon=2, num_workers=0, cache_mib=4)
    splits = {"val_fraction": 0.2, "test_fraction": 0.1, "shuffle_chunks": 2}
    return dataclasses.replace(base, path=str(path), **{**splits, **overrides})
