"""Model shapes. GPT presets and a time-series transformer share one block design."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.config.errors import below_minimum


@dataclass
class ModelConfig:
    kind: str = "gpt"  # gpt | timeseries
    name: str = "gpt_tiny"
    num_layers: int = 2
    dim: int = 64
    num_heads: int = 4
    mlp_ratio: float = 4.0
    vocab_size: int = 256  # gpt only: byte-level data needs >= 256
    max_seq_len: int = 256
    num_series: int = 0  # timeseries only: input features per time step
    num_targets: int = 0  # timeseries only: outputs per sample (0: num_series)
    norm_eps: float = 1e-5
    init_std: float = 0.02
    # Which kernels the model's norms and loss run on (toolkit.kernels): torch (PyTorch ops),
    # liger (Liger's Triton kernels; a GPU, or TRITON_INTERPRET=1 on CPU for tests), auto
    # (liger where it is installed and a GPU runs the model, else torch: same numerics contract).
    kernels: str = "torch"

    KINDS = ("gpt", "timeseries")
    KERNELS = ("torch", "liger", "auto")


def problems(m: ModelConfig) -> list[str]:
    """Problems with the model's shape, one line each."""
    p = []
    if m.kind not in ModelConfig.KINDS:
        p.append(
            f"model.kind={m.kind}: unknown model kind; allowed: {', '.join(ModelConfig.KINDS)}"
        )
    if m.kernels not in ModelConfig.KERNELS:
        p.append(f"model.kernels={m.kernels}: unknown; allowed: {', '.join(ModelConfig.KERNELS)}")
    p += below_minimum(
        "model", m, dict.fromkeys(("num_layers", "dim", "num_heads", "max_seq_len"), 1)
    )
    if m.num_heads >= 1 and m.dim % m.num_heads:
        p.append(f"model.dim={m.dim}: must be divisible by model.num_heads={m.num_heads}")
    if m.kind == "timeseries" and m.num_series < 1:
        p.append(f"model.num_series={m.num_series}: must be >= 1 for the time-series model")
    if m.num_targets < 0:
        p.append(f"model.num_targets={m.num_targets}: must be >= 0 (0: model.num_series)")
    return p
