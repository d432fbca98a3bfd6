"""`configure()`: what every rank does before joining the process group."""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from toolkit.config.nccl import NcclConfig
from toolkit.distributed.env import DistEnv
from toolkit.nccl.checks import node_problems, value_problems
from toolkit.nccl.detect import Decision, plan
from toolkit.nccl.env import Setting, apply, describe, effective_env, resolve
from toolkit.nccl.known import unknown_names
from toolkit.nccl.sysfs import scan
from toolkit.redact import redact, redact_text

log = logging.getLogger("toolkit.nccl")


class NcclSetupError(RuntimeError):
    """This node cannot run the requested NCCL settings; raised before any collective."""


@dataclass
class NcclSetup:
    fabric: str
    decisions: list[Decision]
    settings: dict[str, Setting]


def configure(
    cfg: NcclConfig,
    env: DistEnv,
    run_dir: Path,
    environ: dict[str, str] | None = None,
    deterministic: bool = False,
) -> NcclSetup:
    """Detect, layer, check and export the NCCL/PyTorch variables of this rank; write
    RUN_DIR/nccl-env-node<k>.json (local rank 0). Raises NcclSetupError naming rank and node.
    `deterministic` (trainer.deterministic): a fixed algorithm and protocol."""
    target = os.environ if environ is None else environ
    host = socket.gethostname()
    where = f"rank {env.rank} on {host} (node {env.node_rank})"
    topo = scan(cfg.sysfs_root)
    fabric, decisions = plan(topo, cfg.profile, env.num_nodes)
    settings = resolve(cfg, decisions, target, env.rank, run_dir, deterministic)
    merged = {name: s.value for name, s in settings.items()}
    for line in unknown_names(list(merged)):
        log.warning("nccl: %s", line)
    if merged.get("NCCL_IB_DISABLE") == "1" and "NCCL_IB_HCA" in merged:
        log.warning(
            "nccl: NCCL_IB_HCA=%s has no effect: NCCL_IB_DISABLE=1 (%s)",
            merged["NCCL_IB_HCA"],
            settings["NCCL_IB_DISABLE"].source,
        )
    problems = value_problems(merged, "effective") + node_problems(
        cfg.profile, fabric, merged, topo
    )
    if problems:
        raise NcclSetupError("; ".join(f"{where}: {p}" for p in problems))
    # NCCL and PyTorch write their files here but do not create directories.
    (run_dir / "nccl" / "flight_recorder").mkdir(parents=True, exist_ok=True)
    apply(settings, target)
    if env.local_rank == 0:
        for decision in decisions:
            log.info("nccl decision: %s", decision.line())
        for setting in settings.values():
            if setting.source != "detected":
                log.info("nccl: %s", redact_text(describe(setting)))
        record = {
            "node_rank": env.node_rank,
            "hostname": host,
            "profile": cfg.profile,
            "fabric": fabric,
            "decisions": [d.line() for d in decisions],
            "sources": {name: s.source for name, s in settings.items()},
            "env": redact(effective_env(target)),
        }
        path = run_dir / f"nccl-env-node{env.node_rank}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
    return NcclSetup(fabric, decisions, settings)
