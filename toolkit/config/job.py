"""The whole job: one field per config group. Only the launcher and the entrypoint see it;
every component receives its own group's config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolkit.config.checkpoint import CheckpointConfig
from toolkit.config.cluster import ClusterConfig
from toolkit.config.collectives import CollectivesConfig
from toolkit.config.data import DataConfig, DatasetConfig
from toolkit.config.fault import FaultConfig
from toolkit.config.hardware import HardwareConfig
from toolkit.config.launch import LaunchConfig
from toolkit.config.model import KINDS as MODEL_KINDS
from toolkit.config.model import GPTConfig, TargetModelConfig, plugin_from_node
from toolkit.config.nccl import NcclConfig
from toolkit.config.optim import OptimConfig, OptimTargetConfig
from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.config.script import ScriptConfig
from toolkit.config.telemetry import TelemetryConfig
from toolkit.config.tracking import TrackingConfig
from toolkit.config.trainer import TrainerConfig


@dataclass
class JobConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Groups whose node may name your own object (`_target_`, toolkit.config.targets) or
    # one of several schemas: typed by toolkit.config.compose.group_config, not by OmegaConf.
    model: Any = field(default_factory=GPTConfig)
    data: Any = field(default_factory=DataConfig)
    optim: Any = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    collectives: CollectivesConfig = field(default_factory=CollectivesConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    script: ScriptConfig = field(default_factory=ScriptConfig)  # your own script instead
    task: str = "train"  # what every rank runs: see toolkit.tasks.TASKS (script: task_of)
    seed: int = 0
    run_dir: str | None = None  # filled in by the launcher from hydra.run.dir / hydra.sweep.dir


# Config group name -> schema. Each conf/<group>/*.yaml extends `<group>_schema`.
GROUPS: dict[str, type] = {
    "cluster": ClusterConfig,
    "model": GPTConfig,  # the default kind's; each kind has its own (GROUP_KINDS)
    "data": DataConfig,
    "optim": OptimConfig,
    "precision": PrecisionConfig,
    "parallel": ParallelConfig,
    "hardware": HardwareConfig,
    "trainer": TrainerConfig,
    "checkpoint": CheckpointConfig,
    "telemetry": TelemetryConfig,
    "nccl": NcclConfig,
    "launch": LaunchConfig,
    "collectives": CollectivesConfig,
    "fault": FaultConfig,
    "tracking": TrackingConfig,
    "script": ScriptConfig,
}


# Groups whose node may hold `_target_` (toolkit.config.targets): group -> the schema of such
# a node (the toolkit's settings for it; every other key is a keyword argument). A group
# listed here is typed by toolkit.config.compose.group_config.
TARGET_SCHEMAS: dict[str, type] = {
    "model": TargetModelConfig,
    "data": DatasetConfig,
    "optim": OptimTargetConfig,
}
# group -> kind -> schema, for groups whose kinds have schemas of their own; a node of another
# kind is typed by OTHER_KINDS[group] (a model registered through entry points).
GROUP_KINDS: dict[str, dict[str, type]] = {"model": MODEL_KINDS}
OTHER_KINDS: dict[str, Callable[[dict[str, Any]], Any]] = {"model": plugin_from_node}
# Groups typed by group_config rather than by merging into JobConfig (their JobConfig field is
# `Any`, so that a `_target_` node or another schema composes).
OPEN_GROUPS = ("model", "data", "optim")
