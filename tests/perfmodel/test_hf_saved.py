"""A Hugging Face causal LM cannot be counted on meta tensors (transformers' mask code reads
values), so its spec states the activations it saves; here that statement is checked against
what torch.autograd saves when the model really runs forward on CPU, for several widths."""

from __future__ import annotations

import pytest
import torch

from toolkit.config.model import HFModelConfig
from toolkit.train.models import hf

pytest.importorskip("transformers")

TINY = dict(
    model_type="llama",
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def saved_bytes(cfg: HFModelConfig, seq_len: int) -> int:
    """Bytes of the distinct tensors autograd keeps for backward (parameters excluded)."""
    torch.manual_seed(0)
    model = hf.build(cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, cfg.config["vocab_size"], (1, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=tokens, labels=tokens)
    return sum(n for ptr, n in kept.items() if ptr not in params)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"num_hidden_layers": 3, "intermediate_size": 192},
        {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3},
        {"model_type": "qwen2", "vocab_size": 384},
    ],
    ids=["llama_tiny", "deeper_wider_mlp", "wider", "qwen2"],
)
def test_the_stated_saved_activations_match_what_autograd_keeps(change):
    cfg = HFModelConfig(config={**TINY, **change})
    stated = hf.saved_bytes_per_sample(cfg, 96)
    measured = saved_bytes(cfg, 96)
    assert stated == pytest.approx(measured, rel=0.02), (stated, measured)
