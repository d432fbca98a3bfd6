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

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config.model import HFModelConfig
from toolkit.distributed.tensor_parallel import apply_published_plan, published_plan_problems
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


def save_pretrained(cfg: HFModelConfig, tensors: dict[str, torch.Tensor], out: Path) -> Path:
    """Write `tensors` (a checkpoint's consolidated model, keyed as the model names its
    parameters: model.layers.0...., lm_head.weight) as a directory transformers'
    `from_pretrained` loads: config.json (the config class's own JSON, model_type and
    architectures included) and model.safetensors (with the "pt" format metadata
    transformers checks). `out` must not exist, or be an empty directory."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; give a new directory")
    config = transformers_config(cfg)
    with torch.device("meta"):  # the class's name for config.json's architectures
        config.architectures = [type(AutoModelForCausalLM.from_config(config)).__name__]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


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


def tp_plan(config) -> dict[str, str] | None:  # config: transformers.PretrainedConfig
    """The tensor-parallel plan transformers publishes for the base model (the config
    class's `base_model_tp_plan`: module pattern -> "colwise" | "rowwise" | ...)."""
    plan = getattr(config, "base_model_tp_plan", None)
    return dict(plan) if plan else None


def tp_problems(cfg: HFModelConfig, tp: int) -> list[str]:
    """Why this model cannot run with parallel.tp=tp (one line each; the launcher's check):
    no published plan, a style torch's ParallelStyles do not express, or widths the
    tensor-parallel ranks cannot split evenly (whole heads, whole MLP columns)."""
    config = transformers_config(cfg)
    name = f"parallel.tp={tp}: model.config.model_type={config.model_type}"
    p = [f"{name} {line}" for line in published_plan_problems(tp_plan(config))]
    widths = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "intermediate_size": getattr(config, "intermediate_size", None),
    }
    p += [
        f"parallel.tp={tp} does not divide model.config.{key}={value}: each "
        "tensor-parallel rank needs an equal share"
        for key, value in widths.items()
        if value is not None and value % tp
    ]
    return p


def tensor_parallel(model: nn.Module, tp_mesh) -> nn.Module:  # tp_mesh: DeviceMesh
    """Shard the decoder by transformers' own published plan over the "tp" mesh dim (the
    launcher checked it with tp_problems): q/k/v and the MLP's gate/up column-wise, the
    attention's output and the MLP's down projection row-wise, on the base model
    (`model.model`, the plan's keys being relative to it)."""
    plan = tp_plan(model.config)
    if plan is None:
        raise UserError(f"model.config.model_type={model.config.model_type}: no tp plan")
    apply_published_plan(model.base_model, tp_mesh, plan)
    return model


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
    tensor_parallel=tensor_parallel,
    unit="tokens",
)
