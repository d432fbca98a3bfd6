"""Non-tensor state round-trips through JSON exactly."""

import json
import random

import numpy as np
import torch

from toolkit.checkpoint.state import capture_rng, config_diff, config_hash, restore_rng


def test_rng_states_round_trip_through_json():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    saved = json.loads(json.dumps(capture_rng()))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(saved)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]


def test_config_hash_and_diff():
    a = {"model": {"dim": 64, "name": "gpt_tiny"}, "seed": 0}
    b = {"model": {"dim": 128, "name": "gpt_tiny"}, "seed": 0}
    assert config_hash(a) == config_hash(json.loads(json.dumps(a)))
    assert config_hash(a) != config_hash(b)
    assert config_diff(a, b) == ["model.dim: 64 -> 128"]
