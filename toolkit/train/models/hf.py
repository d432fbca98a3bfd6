"""Any Hugging Face `transformers` causal LM, built from its config (never downloaded weights):
`model=hf_llama_tiny`, or `model.kind=hf_causal_lm model.config.model_type=llama ...`.

The model's config comes from `transformers.AutoConfig.for_model(model_type, **fields)` and
the model from `AutoModelForCausalLM.from_config`; FSDP2 shards each decoder layer (the
children of the model's largest list of like modules: `model.model.layers` for Llama,
Mistral, Qwen and most others). Batches are the token data's (inputs, targets) pairs: the
loss is the mean next-token cross-entropy over the model's logits, the targets already
shifted by the loader. `transformers` is an optional extra (`pip install -e .[hf]`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config.model import HFModelConfig
from toolkit.errors import UserError
from toolkit.train.models.spec import Batch, ModelSpec, reset_all


def build(cfg: HFModelConfig) -> nn.Module:
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise UserError(
            "model.kind=hf_causal_lm needs the transformers package: pip install -e '.[hf]'"
        ) from None
    fields = dict(cfg.config)
    model_type = str(fields.pop("model_type"))
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        raise UserError(f"model.config.model_type={model_type}: {exc}") from None
    return AutoModelForCausalLM.from_config(config)


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the logits against the loader's (already shifted) targets."""
    inputs, targets = batch
    logits = model(input_ids=inputs, use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def init(model: nn.Module) -> None:
    """transformers' own initialisation, seeded by the caller: the same for every world
    size, and after meta init. `PreTrainedModel._init_weights(module)` is the per-module
    initialiser every model class defines (its weights, norms and the rotary buffers);
    `init_weights()` would skip modules already marked initialised, which after `to_empty`
    hold garbage. Without it (another transformers), each module's reset_parameters()."""
    per_module = getattr(model, "_init_weights", None)
    if not callable(per_module):
        reset_all(model)
        return
    with torch.no_grad():
        for module in model.modules():
            per_module(module)


def flops_per_sample(cfg: HFModelConfig, seq_len: int) -> float:
    """PaLM's model FLOPs (Chowdhery et al. 2022, appendix B), as for the built-in GPT:
    6 x the parameters outside the input embedding per token, plus 12 x layers x width x
    sequence length for attention; times the sequence length per sample. Parameters are
    counted on the meta device (no memory). Counting by running the model (toolkit.perfmodel.
    counted) does not apply: transformers' mask code reads tensor values (.item())."""
    with torch.device("meta"):
        model = build(cfg)
    embedding = model.get_input_embeddings().weight.numel()
    params = sum(p.numel() for p in dict(model.named_parameters()).values()) - embedding
    config = model.config
    width = config.num_attention_heads * getattr(
        config, "head_dim", config.hidden_size // config.num_attention_heads
    )
    per_token = 6.0 * params + 12.0 * config.num_hidden_layers * width * seq_len
    return per_token * seq_len


SPEC = ModelSpec(
    name="hf_causal_lm",
    build=build,
    loss=loss,
    init=init,
    flops_per_sample=flops_per_sample,
    unit="tokens",
)
