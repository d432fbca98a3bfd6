"""Pipeline parallelism with torch.distributed.pipelining: the model split into stages of
consecutive layers over the mesh's pp dimension, each stage sharded by FSDP2 over the
data-parallel dims, run by a GPipe, 1F1B or interleaved 1F1B schedule.

With pp ranks and v virtual stages per rank there are S = pp x v stages; pp rank r runs
stages r, r + pp, ... (the interleaved schedules' loop order). A rank keeps one model
(`Pipeline.model`) holding the layers of all its stages, with the logical parameter names
(toolkit.train.models.stages): checkpoints, the optimizer and telemetry see that one, and
each stage is a part of it sharing its modules. The step's micro-batches are the loader's
(trainer.micro_batch_size sequences each, trainer.grad_accum of them): the last stage
computes the loss of each through the schedule's loss_fn, gradients are scaled by
1/micro-batches, as the accumulation loop does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from toolkit.config.parallel import MeshShape, ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.distributed.commtime import CommTimer
from toolkit.distributed.fsdp import clip_grad_norm_, parallelize
from toolkit.distributed.mesh import data_parallel_mesh
from toolkit.train.models.stages import StagedModel
from toolkit.train.steps import MicroBatches

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
}
DTYPE_CODES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
HEADER = 8  # int64s: ndim, up to 6 sizes, dtype code


# -- which layers go where ------------------------------------------------------------------
def stage_layers(split: list[int]) -> list[list[int]]:
    """The layer indices of every stage from the layers per stage (parallel.pp_split, or the
    performance model's balanced split: toolkit.tasks.train.pipeline_split)."""
    out, start = [], 0
    for n in split:
        out.append(list(range(start, start + n)))
        start += n
    return out


def stage_ids(pp_rank: int, pp: int, virtual: int) -> list[int]:
    """The stages pp rank `pp_rank` runs, in order (loop placement)."""
    return [pp_rank + k * pp for k in range(virtual)]


# -- building --------------------------------------------------------------------------------
@dataclass
class Pipeline:
    model: StagedModel  # this rank's layers (all its stages), logical parameter names
    parts: list[StagedModel]  # one per stage this rank runs, sharing model's modules
    ids: list[int]  # their stage indices
    num_stages: int
    pp_rank: int
    pp: int
    group: dist.ProcessGroup

    @property
    def has_first(self) -> bool:
        return 0 in self.ids

    @property
    def has_last(self) -> bool:
        return self.num_stages - 1 in self.ids


def build_pipeline(
    model: StagedModel,
    mesh: DeviceMesh,
    shape: MeshShape,
    par: ParallelConfig,
    precision: PrecisionConfig,
    split: list[int],
    tensor_parallel: Callable[[nn.Module, DeviceMesh], nn.Module] | None = None,
) -> Pipeline:
    """Keep this rank's stages of `model` (the rest is dropped), split them over the tp
    ranks (tensor parallelism, when tp > 1: stage boundaries then carry the sequence-sharded
    hidden states [batch, seq / tp, dim] between ranks of the same tp coordinate) and shard
    each stage with FSDP2 over the data-parallel dims: every block, then the stage's root
    (its embeddings or norm and head). Parameters stay where they are (CPU, or meta with
    parallel.meta_init)."""
    pp_rank = mesh["pp"].get_local_rank()
    layers = stage_layers(split)
    ids = stage_ids(pp_rank, shape.pp, par.pp_virtual_stages)
    num_stages = len(layers)
    mine = sorted(i for s in ids for i in layers[s])
    everything = set(model.state_dict())
    kept = model.part(mine, first=0 in ids, last=num_stages - 1 in ids)
    # The other stages' keys: a checkpoint holds them, and they still belong to the model
    # (toolkit.checkpoint.loading.keys_elsewhere).
    kept.keys_elsewhere = frozenset(everything - set(kept.state_dict()))
    if shape.tp > 1 and tensor_parallel is not None:  # the launcher refused tp without one
        tensor_parallel(kept, mesh["tp"])
    parts = [kept.part(layers[s], first=s == 0, last=s == num_stages - 1) for s in ids]
    dp_mesh = data_parallel_mesh(mesh, shape)
    for part in parts:
        parallelize(part, dp_mesh, par, precision)
    return Pipeline(kept, parts, ids, num_stages, pp_rank, shape.pp, mesh.get_group("pp"))


# -- the step ---------------------------------------------------------------------------------
class PipelineStep:
    """The pipeline schedule as the Trainer's step strategy (toolkit.train.steps)."""

    def __init__(
        self,
        pipe: Pipeline,
        schedule: str,
        device: torch.device,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        loss_ranks: int,
        timer: CommTimer | None = None,
    ):
        self.pipe = pipe
        self.schedule_name = schedule
        self.device = device
        self.loss_fn = loss_fn
        self.loss_ranks = loss_ranks  # the last stage's ranks
        self.timer = timer  # clipping's all-reduce is timed as communication
        self.stages = [
            PipelineStage(part, sid, pipe.num_stages, device, group=pipe.group)
            for part, sid in zip(pipe.parts, pipe.ids, strict=True)
        ]
        self.schedule = None
        self.n_microbatches = 0

    def _schedule(self, n_microbatches: int):
        """The schedule for `n_microbatches` (built again when a resume re-splits the batch)."""
        if self.schedule is None or n_microbatches != self.n_microbatches:
            cls = SCHEDULES[self.schedule_name]
            stages = self.stages if self.schedule_name == "interleaved_1f1b" else self.stages[0]
            self.schedule = cls(stages, n_microbatches, loss_fn=self.loss_fn, scale_grads=True)
            self.n_microbatches = n_microbatches
        return self.schedule

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor:
        """One pass of the schedule over the micro-batches; the mean loss on the last stage's
        ranks, 0 on the others."""
        schedule = self._schedule(len(micro_batches))
        args = ()
        if self.pipe.has_first:
            args = (torch.cat([x for x, _ in micro_batches]).to(self.device),)
        target = None
        if self.pipe.has_last:
            target = torch.cat([y for _, y in micro_batches]).to(self.device)
        losses: list[torch.Tensor] = []
        schedule.step(*args, target=target, losses=losses, return_outputs=False)
        if not self.pipe.has_last:
            return torch.zeros((), device=self.device, dtype=torch.float32)
        return torch.stack([loss.detach().float() for loss in losses]).mean()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The norm over every stage's gradients: each stage's squared norm (over its dp and
        tp shards), summed over the pp group; clipped when max_norm > 0."""
        return clip_grad_norm_(self.pipe.model, max_norm, self.timer, pp_group=self.pipe.group)

    @torch.no_grad()
    def eval_batch(
        self, batch: tuple[torch.Tensor, torch.Tensor], predictions: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Forward only, stage after stage (hidden states sent to the next stage's rank);
        the loss, predictions and targets on the last stage's ranks, Nones elsewhere."""
        inputs, targets = batch
        x = inputs.to(self.device)
        out = None
        for part, sid in zip(self.pipe.parts, self.pipe.ids, strict=True):
            if sid > 0:
                x = self._recv((sid - 1) % self.pipe.pp)
            x = part(x)
            if sid < self.pipe.num_stages - 1:
                self._send(x, (sid + 1) % self.pipe.pp)
            else:
                out = x
        if out is None:
            return None, None, None
        targets = targets.to(self.device)
        return self.loss_fn(out, targets), (out if predictions else None), targets

    def _send(self, x: torch.Tensor, peer: int) -> None:
        header = torch.zeros(HEADER, dtype=torch.int64)
        header[0] = x.dim()
        header[1 : 1 + x.dim()] = torch.tensor(x.shape)
        header[-1] = DTYPE_CODES.index(x.dtype)
        dist.send(header.to(self.device), group_dst=peer, group=self.pipe.group)
        dist.send(x.contiguous(), group_dst=peer, group=self.pipe.group)

    def _recv(self, peer: int) -> torch.Tensor:
        header = torch.zeros(HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, group_src=peer, group=self.pipe.group)
        h = header.tolist()
        x = torch.empty(h[1 : 1 + h[0]], dtype=DTYPE_CODES[h[-1]], device=self.device)
        dist.recv(x, group_src=peer, group=self.pipe.group)
        return x
