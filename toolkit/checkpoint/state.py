"""What a checkpoint holds besides the sharded tensors, as JSON (never pickle): RNG states,
the trainer's counters, scheduler and loader state, the config and its hash; and the check
that a checkpoint's tensors fit the current model before any weight is touched."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the resolved config."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ConfigRecord:
    """The resolved job config as the checkpoint keeps it: canonical JSON and its hash
    (the checkpoint component gets this, not the job object)."""

    text: str
    hash: str

    @classmethod
    def of(cls, config: dict[str, Any]) -> ConfigRecord:
        return cls(json.dumps(config, sort_keys=True, default=str), config_hash(config))

    def as_dict(self) -> dict[str, Any]:
        return json.loads(self.text)


def config_diff(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts."""
    keys = sorted(set(saved) | set(current))
    out = []
    for k in keys:
        a, b = saved.get(k), current.get(k)  # noqa: SIM401 - comparing two dicts, not reading config
        name = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


# Keys whose change changes what is being trained: refused on resume unless
# checkpoint.allow_config_change=true. Every other key (steps, logging, telemetry,
# checkpointing, cluster size, parallel layout, hardware, …) may change.
MEANING_GROUPS = ("model.", "optim.", "data.", "precision.")
MEANING_KEYS = ("seed", "trainer.global_batch_size")
# How data is read, not which: the loader's batches do not depend on these (toolkit.data.loader).
HARMLESS_DATA_KEYS = (
    "data.prefetch",
    "data.cache_dir",
    "data.num_workers",
    "data.pin_memory",
    "data.cache_mib",
    "data.verify",
)
# Which kernels compute the same numbers (toolkit.kernels: same numerics contract, same keys).
HARMLESS_MODEL_KEYS = ("model.kernels",)


def changes_meaning(diff_line: str) -> bool:
    """Whether a `config_diff` line ('key: old -> new') changes what is being trained."""
    key = diff_line.split(":", 1)[0]
    if key.startswith(HARMLESS_DATA_KEYS) or key in HARMLESS_MODEL_KEYS:
        return False
    if key == "trainer.global_batch_size" and diff_line.endswith("-> None"):
        return False  # unset: the checkpoint's global batch is kept (Trainer.load_state_dict)
    return key in MEANING_KEYS or key.startswith(MEANING_GROUPS)


# Keys the learning-rate schedule is computed from (toolkit.train.optim.lr_factor). On resume
# the schedule keeps only its position (steps taken): a change of any of these takes effect
# at the restored step, and the restart event lists it (`schedule_changed`). trainer.steps
# may change without checkpoint.allow_config_change (extending a run), but it moves the end
# of a decaying schedule.
SCHEDULE_KEYS = (
    "optim.lr",
    "optim.schedule",
    "optim.warmup_steps",
    "optim.min_lr_ratio",
    "optim.decay_fraction",
    "trainer.steps",
)


def changes_schedule(diff_line: str) -> bool:
    """Whether a `config_diff` line changes the learning rate of the steps to come."""
    return diff_line.split(":", 1)[0] in SCHEDULE_KEYS


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _from_b64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: torch CPU and CUDA, numpy's global, python's `random`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch_cpu": _b64(torch.get_rng_state()),
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(_from_b64(state["torch_cpu"]))
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            np.array(n["keys"], dtype=np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        saved = [_from_b64(s) for s in state["torch_cuda"]]
        for i, s in enumerate(saved[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def to_json_bytes(obj: Any) -> bytes:
    """JSON of plain state (raises TypeError on anything that is not plain data)."""
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def tensor_shapes(state: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    """Global shapes of the tensors in a (model) state dict, keyed like DCP's flat keys."""
    return {
        f"{prefix}.{k}": tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)
    }


def mismatches(
    metadata: Metadata,
    expected: dict[str, tuple[int, ...]],
    prefix: str,
    elsewhere: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    """Keys missing from the checkpoint, unexpected in it, or with another shape. Keys in
    `elsewhere` belong to the model but are held by other ranks (other pipeline stages):
    not unexpected."""
    saved = {
        k: tuple(v.size)
        for k, v in metadata.state_dict_metadata.items()
        if k.startswith(prefix + ".") and isinstance(v, TensorStorageMetadata)
    }
    problems = [
        f"missing in checkpoint: {k} {list(s)}" for k, s in expected.items() if k not in saved
    ]
    problems += [
        f"not in this model: {k} {list(s)}"
        for k, s in saved.items()
        if k not in expected and k not in elsewhere
    ]
    problems += [
        f"shape of {k}: checkpoint {list(saved[k])}, model {list(s)}"
        for k, s in expected.items()
        if k in saved and saved[k] != s
    ]
    return sorted(problems)
