"""Register the schemas once in Hydra's ConfigStore."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from toolkit.config.job import GROUPS, JobConfig

_registered = False


def register_configs() -> None:
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    cs.store(name="job_schema", node=JobConfig)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=schema)
    _registered = True
