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


def transformers_config(cfg: HFModelConfig):  # -> transformers.PretrainedConfig
    try:
        from transformers import AutoConfig
    except ImportError:
        raise UserError(
            "model.kind=hf_causal_lm needs the transformers package: pip install -e '.[hf]'"
        ) from None
    fields = dict(cfg.config)
    model_type = str(fields.pop("model_type"))
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        raise UserError(f"model.config.model_type={model_type}: {exc}") from None


def build(cfg: HFModelConfig) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(transformers_config(cfg))


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


def saved_bytes_per_sample(cfg: HFModelConfig, seq_len: int) -> float:
    """Activations a Llama-style decoder (Llama, Mistral, Qwen2: RMSNorm, rotary attention
    through SDPA, SwiGLU MLP) saves for backward, per sample, in fp32 bytes. The elements
    per token are those transformers' Llama saves, read with torch.autograd's saved-tensor
    hooks on CPU while varying one width at a time (tests/perfmodel/test_hf_saved.py
    checks them against that measurement): per layer 8 x hidden (both norms' inputs and
    outputs, the rotary inputs, q, the attention output before and after o_proj's
    reshape) + 4 x intermediate (gate, up, SiLU, product) + 2 x the k/v width + one per
    head (the log-sum-exp) + 2 (the norms' rsqrt); then 3.5 x hidden around the final norm
    and the vocabulary's logits, kept in fp32 for the loss. No term in seq_len squared:
    SDPA keeps no attention matrix. Other families (GPT-2's GELU MLP and biases) differ by
    their own layers' tensors."""
    config = transformers_config(cfg)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_width = getattr(config, "num_key_value_heads", None) or heads
    per_layer = 8 * hidden + 4 * config.intermediate_size + 2 * kv_width * head_dim + heads + 2
    per_token = layers * per_layer + 3.5 * hidden + config.vocab_size
    return 4.0 * per_token * seq_len


SPEC = ModelSpec(
    name="hf_causal_lm",
    build=build,
    loss=loss,
    init=init,
    flops_per_sample=flops_per_sample,
    saved_bytes_per_sample=saved_bytes_per_sample,
    unit="tokens",
)
