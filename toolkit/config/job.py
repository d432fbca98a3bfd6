"""The whole job: one field per config group. Only the launcher and the entrypoint see it;
every component receives its own group's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.config.checkpoint import CheckpointConfig
from toolkit.config.cluster import ClusterConfig
from toolkit.config.collectives import CollectivesConfig
from toolkit.config.data import DataConfig
from toolkit.config.fault import FaultConfig
from toolkit.config.hardware import HardwareConfig
from toolkit.config.launch import LaunchConfig
from toolkit.config.model import ModelConfig
from toolkit.config.nccl import NcclConfig
from toolkit.config.optim import OptimConfig
from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.config.telemetry import TelemetryConfig
from toolkit.config.tracking import TrackingConfig
from toolkit.config.trainer import TrainerConfig


@dataclass
class JobConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
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
    task: str = "train"  # what every rank runs: see toolkit.tasks.TASKS
    seed: int = 0
    run_dir: str | None = None  # filled in by the launcher from hydra.run.dir / hydra.sweep.dir


# Config group name -> schema. Each conf/<group>/*.yaml extends `<group>_schema`.
GROUPS: dict[str, type] = {
    "cluster": ClusterConfig,
    "model": ModelConfig,
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
}
