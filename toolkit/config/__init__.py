"""Typed configuration: one dataclass schema per config group, registered in Hydra's ConfigStore."""

from toolkit.config.errors import ConfigError
from toolkit.config.job import GROUPS, JobConfig

__all__ = ["ConfigError", "GROUPS", "JobConfig"]
