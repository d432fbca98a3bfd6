"""The built-in models, their kernels switch, and `build_model` for any model config (its spec:
toolkit.train.models.registry)."""

from __future__ import annotations

from torch import nn

from toolkit.config.model import ModelConfig
from toolkit.train.models.blocks import Block, LayerNorm
from toolkit.train.models.stages import StagedModel


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model `cfg` names, built by its spec (default init)."""
    from toolkit.train.models.registry import build

    return build(cfg)


def use_kernels(model: nn.Module, kernels: str, compiled_blocks: bool = False) -> list[str]:
    """Run `model`'s norms, head and loss on `kernels` ("torch" or "liger", as resolved by
    toolkit.kernels.liger.resolve); call before the model is split or sharded (its stages
    and shards share these modules). Returns what was left on torch, and why.

    Blocks compiled by torch.compile (parallel.compile) keep torch's LayerNorm: Inductor
    fuses it into its own generated Triton kernel, and Liger's autograd function inside the
    compiled region would only break the graph. The final norm and the fused loss are
    outside the compiled blocks and use Liger all the same."""
    in_blocks = {id(m) for b in model.modules() if isinstance(b, Block) for m in b.modules()}
    for module in model.modules():
        if isinstance(module, StagedModel):
            module.kernels = kernels
        elif isinstance(module, LayerNorm):
            kept = compiled_blocks and id(module) in in_blocks
            module.kernels = "torch" if kept else kernels
    if kernels == "liger" and compiled_blocks:
        return ["the blocks' LayerNorms stay torch under parallel.compile (Inductor fuses them)"]
    return []
