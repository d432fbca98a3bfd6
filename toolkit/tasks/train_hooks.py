"""What a training rank reports to and what hooks into its loop: the sinks (metrics file,
console, node telemetry, trackers), the hang watchdog's settings (toolkit.tasks.watchdog,
which the script task imports alone), and the hooks (checkpointing with preemption and
requeue, bad nodes and stragglers, the user's callbacks, profiler windows), each built from
its own part of the job config. toolkit.tasks.train wires them to the Trainer."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from toolkit.config.job import JobConfig
from toolkit.distributed.env import DistEnv, restart_count
from toolkit.events import JsonlSink, Sink
from toolkit.hooks import Hook
from toolkit.tasks.watchdog import watchdog_spec
from toolkit.telemetry.heartbeat import Heartbeat
from toolkit.telemetry.profiler import ProfileHook, profiling_configured
from toolkit.telemetry.sink import StopWhenAgentLost, TelemetrySink, build_telemetry_sinks
from toolkit.train.console import ConsoleSink
from toolkit.train.models.registry import spec_for
from toolkit.train.targets import build_callbacks

log = logging.getLogger(__name__)


def build_sinks(job: JobConfig, env: DistEnv, run_dir: Path) -> list[Sink]:
    sinks: list[Sink] = [JsonlSink(run_dir / "metrics", env.rank, restart_count())]
    if env.is_rank0:
        unit = spec_for(job.model).unit
        console = ConsoleSink(
            job.trainer.steps, 0, job.trainer.log_every, job.trainer.progress, unit
        )
        sinks.append(console)
    # every rank: one collective
    sinks += build_telemetry_sinks(job.telemetry, env, run_dir, watchdog_spec(job, env))
    sinks += tracking_sinks(job, env, run_dir)
    return sinks


def tracking_sinks(job: JobConfig, env: DistEnv, run_dir: Path) -> list[Sink]:
    """TensorBoard, MLflow, W&B on rank 0 (tracking=...; none by default): the job's
    config, redacted by the tracking package, is their parameters; at the end they get a
    few node telemetry series."""
    if not job.tracking.backends:
        return []
    from toolkit.config.compose import job_to_dict
    from toolkit.telemetry.series import node_series
    from toolkit.tracking import build_tracking_sinks

    since = time.time()  # this attempt's samples only: a resumed run sent the earlier ones
    series = functools.partial(node_series, run_dir, since) if job.telemetry.enabled else None
    unit = spec_for(job.model).unit  # a samples model's trackers get samples/s, no tokens/s
    return build_tracking_sinks(
        job.tracking, env.is_rank0, run_dir, job_to_dict(job), series, unit=unit
    )


def telemetry_sink_of(sinks: list[Sink]) -> TelemetrySink | None:
    """This rank's telemetry sink among the trainer's sinks, if it has one."""
    return next((s for s in sinks if isinstance(s, TelemetrySink)), None)


def tracker_sinks_of(sinks: list[Sink]) -> list[Sink]:
    """The trackers (TensorBoard, MLflow, W&B) among the trainer's sinks."""
    from toolkit.tracking.base import TrackerSink

    return [s for s in sinks if isinstance(s, TrackerSink)]


def heartbeat_of(sinks: list[Sink]) -> Heartbeat | None:
    """This rank's heartbeat, when its telemetry sink has one (the watchdog is on)."""
    telemetry = telemetry_sink_of(sinks)
    return telemetry.heartbeat if telemetry is not None else None


def build_hooks(job: JobConfig, env: DistEnv, run_dir: Path, sink: Sink) -> list[Hook]:
    """Checkpointing and scheduler control (see build_checkpoint_hooks), the user's
    callbacks (trainer.callbacks), then profiler windows: last, so that a window opens after
    the other hooks' work of its step."""
    hooks = build_checkpoint_hooks(job, env, run_dir, sink)
    hooks += build_node_hooks(job, env, run_dir, sink)
    if job.telemetry.enabled and job.telemetry.on_agent_lost == "stop":
        telemetry = telemetry_sink_of(getattr(sink, "sinks", [sink]))  # inside the Fanout
        hooks.append(StopWhenAgentLost(telemetry, job.telemetry.agent_restarts))
    hooks += build_callbacks(job.trainer.callbacks)  # the user's own, after the toolkit's
    if profiling_configured(job.telemetry):
        hooks.append(ProfileHook(job.telemetry, run_dir, sink))
    return hooks


def build_checkpoint_hooks(job: JobConfig, env: DistEnv, run_dir: Path, sink: Sink) -> list[Hook]:
    """Checkpointing, and with it scheduler control: preemption signals stop every rank at
    a step boundary, the final checkpoint commits, then the Slurm job is requeued."""
    if not job.checkpoint.enabled:
        return []
    from toolkit.checkpoint.hook import CheckpointHook
    from toolkit.checkpoint.state import ConfigRecord
    from toolkit.config.compose import job_to_dict
    from toolkit.executors.preemption import PreemptionHook, PreemptionSettings, slurm_job_id
    from toolkit.executors.requeue import RequeuePolicy
    from toolkit.redact import redact

    config = ConfigRecord.of(redact(job_to_dict(job)))  # each checkpoint's config.json
    checkpoint = CheckpointHook(job.checkpoint, run_dir, config, sink, job.fault)
    settings = PreemptionSettings(
        signal_name=job.cluster.signal,
        signal_lead_s=job.cluster.signal_lead_s,
        slurm_job_id=slurm_job_id(env.source),
        run_dir=run_dir,
    )
    return [checkpoint, PreemptionHook(checkpoint, sink, RequeuePolicy.of(job), settings)]


def build_node_hooks(job: JobConfig, env: DistEnv, run_dir: Path, sink: Sink) -> list[Hook]:
    """Bad nodes: on Slurm, the exclusions decided for this attempt become events (and a
    detached job's NODE_FAIL is found here); with several ranks, the live straggler score."""
    from toolkit.distributed.env import restart_count
    from toolkit.executors import badnodes
    from toolkit.executors.exclusion import BadNode
    from toolkit.executors.node_events import ExclusionEvents
    from toolkit.executors.preemption import slurm_job_id
    from toolkit.executors.requeue import JobShape
    from toolkit.telemetry.straggler import StragglerHook

    hooks: list[Hook] = []
    job_id = slurm_job_id(env.source)
    if job_id is not None:
        hooks.append(ExclusionEvents(run_dir, job_id, JobShape.of(job), sink))
    if env.world_size > 1 and job.fault.straggler_action != "off":

        def hosts_by_rank() -> list[str]:
            hosts: list[Any] = [None] * env.world_size
            dist.all_gather_object(hosts, badnodes.node_name())
            return [str(h) for h in hosts]

        def mark(node: str, reason: str) -> None:
            try:
                badnodes.mark(run_dir, BadNode(node, reason, restart_count(), "straggler"))
            except OSError as exc:
                log.warning("could not mark node %s for exclusion: %s", node, exc)

        hooks.append(StragglerHook(job.fault, sink, env.world_size, hosts_by_rank, mark))
    return hooks
