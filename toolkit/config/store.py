"""Register the schemas once in Hydra's ConfigStore."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from toolkit.config.job import GROUP_KINDS, GROUPS, OPEN_GROUPS, JobConfig

_registered = False


def register_configs() -> None:
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    # The open groups start empty: their option's node (a schema of its own, or a `_target_`
    # node) is composed into them unchecked by JobConfig, and typed by compose.group_config.
    job = OmegaConf.structured(JobConfig)
    for group in OPEN_GROUPS:
        job[group] = None
    cs.store(name="job_schema", node=job)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=schema)
    # One schema per kind where a group's kinds have their own (model: gpt_schema, ...).
    for group, kinds in GROUP_KINDS.items():
        for kind, schema in kinds.items():
            cs.store(group=group, name=f"{kind}_schema", node=schema)
    _registered = True
