"""Models: built-in transformers, your own nn.Module, registered or Hugging Face models.

One typed config per model, each validated by its own problems().

The built-in models are transformers sharing one block design (TransformerConfig): the GPT
over tokens (GPTConfig) and the causal transformer over multivariate series
(TimeSeriesConfig). Besides them: any Hugging Face causal LM built from its config
(HFModelConfig), your own nn.Module by import path (TargetModelConfig, a `_target_` node),
and a model registered by a package of yours through the `toolkit.models` entry points
(PluginModelConfig: its fields are validated by that model's own config class, in the
launcher). Which runtime model each config builds is the ModelSpec registry's business
(toolkit.train.models.registry); this module only describes and validates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit.config.errors import below_minimum
from toolkit.config.targets import TargetConfig, target_problems

KERNELS = ("torch", "liger", "auto")


@dataclass(frozen=True)
class Supports:
    """What a model's spec can do besides data parallelism (FSDP2/HSDP), and what data it
    reads: tokens (ids), series (real-valued windows of data=returns) or any (its own)."""

    tensor_parallel: bool = False
    pipeline: bool = False
    reads: str = "any"


@dataclass
class TransformerConfig:
    """The shape the built-in transformers share (and the performance model's analytic
    terms read)."""

    kind: str = "gpt"
    name: str = "gpt_tiny"
    num_layers: int = 2
    dim: int = 64
    num_heads: int = 4
    mlp_ratio: float = 4.0
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    init_std: float = 0.02
    # Which kernels the model's norms and loss run on (toolkit.kernels): torch (PyTorch ops),
    # liger (Liger's Triton kernels; a GPU, or TRITON_INTERPRET=1 on CPU for tests), auto
    # (liger where it is installed and a GPU runs the model, else torch: same numerics contract).
    kernels: str = "torch"

    SUPPORTS = Supports()

    @property
    def outputs(self) -> int:
        """Width of the head's output (the vocabulary, or the targets)."""
        raise NotImplementedError

    @property
    def token_inputs(self) -> bool:
        """Whether the model reads token ids (an embedding lookup) rather than values."""
        return False


@dataclass
class GPTConfig(TransformerConfig):
    kind: str = "gpt"
    vocab_size: int = 256  # byte-level data needs >= 256

    SUPPORTS = Supports(tensor_parallel=True, pipeline=True, reads="tokens")

    @property
    def outputs(self) -> int:
        return self.vocab_size

    @property
    def token_inputs(self) -> bool:
        return True


@dataclass
class TimeSeriesConfig(TransformerConfig):
    """Reads [batch, time, num_series], predicts num_targets values (toolkit.train.models.
    timeseries); the norm and loss options: toolkit.kernels.masked_norm / masked_loss."""

    kind: str = "timeseries"
    name: str = "ts_transformer"
    num_series: int = 1  # input features per time step
    num_targets: int = 0  # outputs per sample (0: num_series)
    # Standardise each input feature across instruments at every time step, missing inputs
    # (the loader's exact zeros) left out; the inputs are [instruments x features] per step.
    cross_section_norm: bool = False
    instruments: int = 0  # instruments in num_series (0: num_targets, one target each)
    loss: str = "mse"  # mse | huber; missing targets count in the mean either way
    huber_delta: float = 1.0  # loss=huber: quadratic below this error, linear above
    loss_weights: list[float] = field(default_factory=list)  # per target; empty: all 1

    LOSSES = ("mse", "huber")
    SUPPORTS = Supports(pipeline=True, reads="series")

    @property
    def outputs(self) -> int:
        return self.num_targets or self.num_series


@dataclass
class HFModelConfig:
    """A Hugging Face `transformers` causal LM built from its config, never from downloaded
    weights: `config` holds the config class's fields, e.g. {model_type: llama,
    hidden_size: 64, num_hidden_layers: 2, ...} (transformers.AutoConfig.for_model)."""

    kind: str = "hf_causal_lm"
    name: str = "hf"
    config: dict[str, Any] = field(default_factory=dict)
    max_seq_len: int = 2048  # the longest data.seq_len allowed (positions the model has)

    # Tensor parallelism by transformers' published plan (base_model_tp_plan), where the
    # config class has one: checked by the launcher (toolkit.train.models.hf.tp_problems).
    SUPPORTS = Supports(tensor_parallel=True, reads="tokens")


@dataclass
class TargetModelConfig(TargetConfig):
    """Your own nn.Module by import path: `_target_` and its keyword arguments (Hydra's
    instantiate convention), plus these settings:"""

    name: str = ""  # shown in reports and the planner ("": the class name)
    # The micro-batch's loss. auto: the model's own (a `loss(output, targets)` method, or a
    # forward that returns the loss: `forward(inputs, targets)`, `forward(**batch)` for a
    # dict batch); else mse | huber | cross_entropy over (model(inputs), targets), or the
    # import path of a function (output, targets) -> loss.
    loss: str = "auto"
    # The modules FSDP2 shards one by one (and activation checkpointing / compile wrap), by
    # class import path; empty: the children of the model's largest list of like modules
    # (its layers), if it has one, else the whole model as one unit.
    units: list[str] = field(default_factory=list)
    max_seq_len: int = 0  # the longest data.seq_len the model takes (0: no limit)

    LOSSES = ("auto", "mse", "huber", "cross_entropy")
    SUPPORTS = Supports()


@dataclass
class PluginModelConfig:
    """A model registered by your package under the `toolkit.models` entry points: `kind`
    is its registered name, the other keys are its own config's fields (checked against
    that config class by the launcher)."""

    kind: str = ""
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)


ModelConfig = GPTConfig | TimeSeriesConfig | HFModelConfig | TargetModelConfig | PluginModelConfig

# kind -> schema of the built-in kinds (toolkit.config.compose.group_config types a node by
# it; any other kind is a plugin's).
KINDS: dict[str, type] = {
    "gpt": GPTConfig,
    "timeseries": TimeSeriesConfig,
    "hf_causal_lm": HFModelConfig,
}


def plugin_from_node(node: dict[str, Any]) -> PluginModelConfig:
    """A node whose kind no built-in schema has: a registered (entry-point) model's."""
    options = {k: v for k, v in node.items() if k not in ("kind", "name")}
    return PluginModelConfig(str(node["kind"]), str(node.get("name") or node["kind"]), options)


def supports(m: ModelConfig) -> Supports | None:
    """What the model's spec supports; None for a registered plugin model (its spec says,
    checked by the launcher, toolkit.train.models.registry)."""
    return getattr(m, "SUPPORTS", None)


def max_seq_len(m: ModelConfig) -> int:
    """The longest sequence the model takes (0: no limit of its own)."""
    return getattr(m, "max_seq_len", 0)


def vocab_size(m: ModelConfig) -> int | None:
    """The token vocabulary of a model that reads token ids (None: it reads values, or its
    own data)."""
    if isinstance(m, HFModelConfig):
        size = m.config.get("vocab_size")
        return int(size) if size is not None else None
    return getattr(m, "vocab_size", None)


def series_shape(m: ModelConfig) -> tuple[int, int]:
    """(inputs per time step, targets per sample) of a model sized by its series data; (0, 0)
    for any other (the dataset then checks nothing against the model)."""
    return getattr(m, "num_series", 0), getattr(m, "num_targets", 0)


def display_name(m: ModelConfig) -> str:
    if isinstance(m, TargetModelConfig):
        return m.name or m.target.rsplit(".", 1)[-1]
    return m.name or m.kind


def num_instruments(m: TimeSeriesConfig) -> int:
    """Instruments in the time-series model's input: model.instruments, else num_targets."""
    return m.instruments or m.num_targets


def problems(m: ModelConfig) -> list[str]:
    """Problems with the model group, one line each (each config by its own checks)."""
    if isinstance(m, TargetModelConfig):
        return target_model_problems(m)
    if isinstance(m, HFModelConfig):
        return hf_problems(m)
    if isinstance(m, PluginModelConfig):
        return []  # its own config class checks it (the launcher's runtime check)
    p = transformer_problems(m)
    if isinstance(m, TimeSeriesConfig):
        p += timeseries_problems(m)
    return p


def transformer_problems(m: TransformerConfig) -> list[str]:
    p = []
    if m.kernels not in KERNELS:
        p.append(f"model.kernels={m.kernels}: unknown; allowed: {', '.join(KERNELS)}")
    p += below_minimum(
        "model", m, dict.fromkeys(("num_layers", "dim", "num_heads", "max_seq_len"), 1)
    )
    if m.num_heads >= 1 and m.dim % m.num_heads:
        p.append(f"model.dim={m.dim}: must be divisible by model.num_heads={m.num_heads}")
    return p


def timeseries_problems(m: TimeSeriesConfig) -> list[str]:
    """Problems with the time-series model's inputs, cross-sectional norm and loss."""
    p = below_minimum("model", m, {"instruments": 0, "num_series": 1, "num_targets": 0})
    if m.loss not in TimeSeriesConfig.LOSSES:
        p.append(f"model.loss={m.loss}: unknown; allowed: {', '.join(TimeSeriesConfig.LOSSES)}")
    if m.loss == "huber" and not m.huber_delta > 0:
        p.append(f"model.huber_delta={m.huber_delta}: must be > 0 for model.loss=huber")
    n = num_instruments(m)
    if m.cross_section_norm and n < 1:
        p.append(
            "model.cross_section_norm=true: needs model.instruments (or model.num_targets) >= 1"
        )
    elif m.cross_section_norm and m.num_series % n:
        p.append(
            f"model.num_series={m.num_series}: not a whole number of features for "
            f"{n} instruments; set model.instruments to a divisor of model.num_series"
        )
    if m.loss_weights and len(m.loss_weights) != m.outputs:
        p.append(
            f"model.loss_weights has {len(m.loss_weights)} values: needs one per target "
            f"({m.outputs}) or none"
        )
    if any(not w >= 0 for w in m.loss_weights):
        p.append("model.loss_weights: every weight must be >= 0")
    return p


def target_model_problems(m: TargetModelConfig) -> list[str]:
    p = target_problems("model", m)
    if m.loss not in TargetModelConfig.LOSSES and not _is_import_path(m.loss):
        p.append(
            f"model.loss={m.loss}: unknown; allowed: {', '.join(TargetModelConfig.LOSSES)} "
            "or the import path of a function (output, targets) -> loss"
        )
    p += [
        f"model.units: {unit!r} is not an import path (module.Class)"
        for unit in m.units
        if not _is_import_path(unit)
    ]
    return p + below_minimum("model", m, {"max_seq_len": 0})


def hf_problems(m: HFModelConfig) -> list[str]:
    p = below_minimum("model", m, {"max_seq_len": 1})
    if not m.config.get("model_type"):
        p.append(
            "model.config.model_type: missing; name the transformers model type, "
            "e.g. model.config.model_type=llama"
        )
    return p


def _is_import_path(text: str) -> bool:
    return not target_problems("model", TargetConfig(target=text))
