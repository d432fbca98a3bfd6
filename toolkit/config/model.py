"""Model shapes. GPT presets and a time-series transformer share one block design."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # --- timeseries only (toolkit.kernels.masked_norm / masked_loss; docs/kernels.md) ---
    # Standardise each input feature across instruments at every time step, missing inputs
    # (the loader's exact zeros) left out; the inputs are [instruments x features] per step.
    cross_section_norm: bool = False
    instruments: int = 0  # instruments in num_series (0: num_targets, one target each)
    loss: str = "mse"  # mse | huber; missing targets count in the mean either way
    huber_delta: float = 1.0  # loss=huber: quadratic below this error, linear above
    loss_weights: list[float] = field(default_factory=list)  # per target; empty: all 1

    KINDS = ("gpt", "timeseries")
    KERNELS = ("torch", "liger", "auto")
    LOSSES = ("mse", "huber")


def num_instruments(m: ModelConfig) -> int:
    """Instruments in the time-series model's input: model.instruments, else num_targets."""
    return m.instruments or m.num_targets


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
    return p + timeseries_problems(m)


def timeseries_problems(m: ModelConfig) -> list[str]:
    """Problems with the time-series model's cross-sectional norm and loss, one line each."""
    p = below_minimum("model", m, {"instruments": 0})
    if m.loss not in ModelConfig.LOSSES:
        p.append(f"model.loss={m.loss}: unknown; allowed: {', '.join(ModelConfig.LOSSES)}")
    if m.loss == "huber" and not m.huber_delta > 0:
        p.append(f"model.huber_delta={m.huber_delta}: must be > 0 for model.loss=huber")
    ts = m.kind == "timeseries"
    if not ts and (m.cross_section_norm or m.loss != "mse" or m.loss_weights):
        p.append(
            f"model.kind={m.kind}: model.cross_section_norm, model.loss and model.loss_weights "
            "are for model.kind=timeseries; leave them at their defaults"
        )
    n = num_instruments(m)
    if ts and m.cross_section_norm and n < 1:
        p.append(
            "model.cross_section_norm=true: needs model.instruments (or model.num_targets) >= 1"
        )
    elif ts and m.cross_section_norm and m.num_series % n:
        p.append(
            f"model.num_series={m.num_series}: not a whole number of features for "
            f"{n} instruments; set model.instruments to a divisor of model.num_series"
        )
    outputs = m.num_targets or m.num_series
    if ts and m.loss_weights and len(m.loss_weights) != outputs:
        p.append(
            f"model.loss_weights has {len(m.loss_weights)} values: needs one per target "
            f"({outputs}) or none"
        )
    if any(not w >= 0 for w in m.loss_weights):
        p.append("model.loss_weights: every weight must be >= 0")
    return p
