"""Ensembles: K members of one architecture trained at once in each rank (trainer.ensemble=K).

Each member is built exactly as a separate run builds its model: torch.manual_seed(member
seed), the spec's build and initialise. Their parameters and buffers are stacked along a
new leading dim into a `Stack`, whose model has the plain model's parameter names, so that
a checkpoint holds [K, ...] tensors under the model's own names and one member is exported
by taking its slice (toolkit.train.ensemble_io). A step runs the spec's loss of every
member at once: torch.func.vmap over the stacked tensors, functional_call of one stateless
copy of the model (randomness="different": each member draws its own dropout masks).

Data order: every member sees the same batches, those of data.order_seed (None: the job's
seed). A member's seed sets its initialisation (and its dropout draws under vmap). The
separate run a member equals is the plain run `seed=<member seed> data.order_seed=<the
ensemble's data order>` with its learning rate, weight decay and warm-up; losses agree to
1e-5 relative (float reordering: vmap batches the members' matmuls; docs/ensembles.md,
"What a member equals"). Dropout masks are not a separate run's bitwise: under vmap they
come from one generator.

Data parallelism: every rank holds all K members; after backward the stacked gradients are
averaged over the ranks with one all-reduce (DDP's way; FSDP2 is not used for an ensemble),
then clipped per member (each member's own global grad norm), then StackedAdamW steps.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from toolkit.config.optim import OptimConfig
from toolkit.config.trainer import TrainerConfig, member_names
from toolkit.errors import UserError
from toolkit.train.models.spec import Batch, LossFn, to_device
from toolkit.train.steps import EvalResult, MicroBatches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One member's settings, resolved from trainer.members and the job's values."""

    name: str
    index: int
    seed: int
    lr: float
    weight_decay: float
    warmup_steps: int
    dropout: float | None  # None: the model's own dropout modules as built

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def resolve_members(t: TrainerConfig, seed: int, optim: OptimConfig) -> list[Member]:
    """The K members: each key of trainer.members[i], or the job's value (seed: seed + i,
    name: m<i>); trainer.problems has checked the keys and values."""
    names = member_names(t.ensemble)
    members = []
    for i in range(t.ensemble):
        given = t.members[i] if t.members else {}
        members.append(
            Member(
                name=str(given["name"]) if "name" in given else names[i],
                index=i,
                seed=int(given["seed"]) if "seed" in given else seed + i,
                lr=float(given["lr"]) if "lr" in given else optim.lr,
                weight_decay=float(given["weight_decay"])
                if "weight_decay" in given
                else optim.weight_decay,
                warmup_steps=int(given["warmup_steps"])
                if "warmup_steps" in given
                else optim.warmup_steps,
                dropout=float(given["dropout"]) if "dropout" in given else None,
            )
        )
    return members


def solo_member(t: TrainerConfig, seed: int, optim: OptimConfig) -> Member | None:
    """trainer.ensemble=1 with one trainer.members entry: the run of that member alone (the
    plain path: its seed for the model, data.order_seed or the job's seed for the data order, its
    optimizer settings). The same run as `seed=<its seed> data.order_seed=<the job's>` with its
    settings, the reference docs/ensembles.md names. None otherwise."""
    if t.ensemble != 1 or not t.members:
        return None
    return resolve_members(t, seed, optim)[0]


def as_member_optim(optim: OptimConfig, member: Member) -> OptimConfig:
    return dataclasses.replace(
        optim, lr=member.lr, weight_decay=member.weight_decay, warmup_steps=member.warmup_steps
    )


def set_dropout_rate(model: nn.Module, p: float, where: str) -> None:
    """Every nn.Dropout of `model` at rate `p` (a member run alone); a UserError when it has
    none."""
    found = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    if not found:
        raise UserError(no_dropout(p, where))
    for module in found:
        module.p = p


def no_dropout(p: float, where: str) -> str:
    return (
        f"{where}.dropout={p}: the model has no nn.Dropout module to set; remove the "
        "member's dropout, or give the model dropout layers"
    )


class MemberDropout(nn.Module):
    """nn.Dropout whose rate is a buffer: stacked with the other buffers, so that under vmap
    each member drops with its own rate (trainer.members[i].dropout)."""

    def __init__(self, p: float):
        super().__init__()
        self.register_buffer("p", torch.tensor(float(p)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = (torch.rand_like(x) >= self.p).to(x.dtype)
        return x * keep / (1 - self.p)


def set_dropout(model: nn.Module, p: float, where: str) -> None:
    """Replace each nn.Dropout of `model` by a MemberDropout of rate `p`; a UserError when the
    model has none (the member's dropout would be ignored)."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Dropout)]
    if not found:
        raise UserError(no_dropout(p, where))
    for name, _ in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, MemberDropout(p))


def unbatchable(model: nn.Module) -> str | None:
    """The first module vmap cannot run per member (it updates a buffer in place while
    training), as one line naming it and what to do; None when there is none."""
    for name, module in model.named_modules():
        # BatchNorm*, SyncBatchNorm, InstanceNorm* with running statistics (torch's public
        # classes share no public base: what they have in common is this flag and buffer)
        running = getattr(module, "running_mean", None) is not None
        if getattr(module, "track_running_stats", False) and running:
            kind = type(module).__name__
            return (
                f"model.{name or '(root)'}: {kind} updates running statistics in place, "
                f"which vmap cannot do per member; use LayerNorm or "
                f"track_running_stats=False, or trainer.ensemble=1"
            )
    return None


class _LossOf(nn.Module):
    """The spec's loss of `model` as a module's forward, so that functional_call can run it
    (and the user's model.loss, if the spec calls one) with a member's tensors."""

    def __init__(self, model: nn.Module, loss: LossFn):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.loss(self.model, batch)


class Stack:
    """The members' parameters and buffers stacked along dim 0 in `model`: a copy of member
    0's modules holding [K, ...] tensors under the model's own names (what the optimizer
    steps and a checkpoint saves; not callable itself), and `member_losses`, which runs
    every member on one micro-batch."""

    def __init__(self, members: list[nn.Module], loss: LossFn):
        first = members[0]
        self.model = copy.deepcopy(first)
        params = [dict(m.named_parameters()) for m in members]
        stacked: dict[int, nn.Parameter] = {}  # one per tensor: tied names share it
        for name, param in list(first.named_parameters(remove_duplicate=False)):
            if id(param) not in stacked:
                stacked[id(param)] = nn.Parameter(torch.stack([p[name].detach() for p in params]))
            _replace(self.model, name, stacked[id(param)])
        buffers = [dict(m.named_buffers()) for m in members]
        persistent = set(first.state_dict())
        for name, _ in list(first.named_buffers()):
            value = torch.stack([b[name] for b in buffers])
            _replace(self.model, name, value, buffer=True, persistent=name in persistent)
        self.num_members = len(members)
        # The stateless copy functional_call runs: on the meta device, holding nothing.
        self.stateless = _LossOf(copy.deepcopy(first).to("meta"), loss)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every name the stateless copy has, tied ones included (moving it to the meta
        device unties them), mapped to the stacked tensors."""
        model = self.model
        state = {f"model.{n}": p for n, p in model.named_parameters(remove_duplicate=False)}
        state.update({f"model.{n}": b for n, b in model.named_buffers(remove_duplicate=False)})
        return state

    def member_losses(self, batch: Batch) -> torch.Tensor:
        """[K] losses of the members on one micro-batch (autograd reaches the stack); in
        train or eval mode as the stacked model is."""
        stateless = self.stateless.train(self.model.training)

        def one(tensors: dict[str, torch.Tensor], batch: Batch) -> torch.Tensor:
            return functional_call(stateless, tensors, (batch,))

        run = vmap(one, in_dims=(0, None), randomness="different")
        # Attention by the math kernel: its matmuls and softmax batch over the members. The
        # fused kernels do not under vmap: CPU flash attention has no vmap rule (vmap loops
        # over the members), CUDA's memory-efficient attention fails in backward ("LSE is
        # not correctly aligned", torch 2.11 on an H100).
        with sdpa_kernel(SDPBackend.MATH):
            return run(self.tensors(), batch)

    def member_state(self, index: int) -> dict[str, torch.Tensor]:
        """Member `index`'s tensors as the plain model's state dict."""
        return {k: v[index].detach().clone() for k, v in self.model.state_dict().items()}


def _replace(
    model: nn.Module, name: str, value: torch.Tensor, buffer: bool = False, persistent: bool = True
) -> None:
    """Put `value` where `name` was in `model`, as a parameter or a buffer (kept out of the
    state dict as the member's own was: MemberDropout's rate)."""
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    delattr(parent, attr)
    if buffer:
        parent.register_buffer(attr, value, persistent=persistent)
    else:
        parent.register_parameter(attr, value)


def build_stack(build: Any, members: list[Member], loss: LossFn, device: torch.device) -> Stack:
    """Each member built as a separate run builds its model (`build()` after
    torch.manual_seed(member.seed)), its dropout set, then stacked on `device`. A model vmap
    cannot batch is refused in one line before training (UserError)."""
    models = []
    for member in members:
        torch.manual_seed(member.seed)
        model = build()
        if member.dropout is not None:
            set_dropout(model, member.dropout, f"trainer.members[{member.index}]")
        models.append(model)
    problem = unbatchable(models[0])
    if problem is not None:
        raise UserError(problem)
    stack = Stack(models, loss)
    stack.model.to(device)
    return stack


def world_size() -> int:
    """The data-parallel ranks (1 without a process group: a benchmark's one process)."""
    return dist.get_world_size() if dist.is_initialized() else 1


class EnsembleStep:
    """The step strategy of an ensemble (toolkit.train.steps.StepStrategy): the members'
    forward/backward over the micro-batches, the stacked gradients averaged over the ranks
    (one all-reduce), per-member clipping, and per-member eval losses. Its losses and grad
    norms are [K] tensors; a dropped member (`alive` False) adds nothing to the backward."""

    def __init__(
        self,
        stack: Stack,
        device: torch.device,
        alive: torch.Tensor,
        compute_dtype: torch.dtype = torch.float32,
    ):
        self.stack = stack
        self.model = stack.model
        self.device = device
        self.alive = alive
        # precision.param_dtype bfloat16/float16: the members compute under torch.autocast,
        # their weights, gradients and optimizer states stay fp32 (no FSDP2 to cast them).
        self.compute_dtype = compute_dtype
        self.loss_ranks = world_size()
        self._checked = False

    def forward_backward(self, micro_batches: MicroBatches) -> torch.Tensor:
        accum = len(micro_batches)
        k = self.stack.num_members
        loss_sum = torch.zeros(k, device=self.device, dtype=torch.float32)
        alive = self.alive.to(self.device)
        for batch in micro_batches:
            batch = to_device(batch, self.device)
            losses = self._losses(batch) / accum
            torch.where(alive, losses, 0.0).sum().backward()
            loss_sum += losses.detach().float()
        self._average_gradients()
        return loss_sum

    def _forward(self, batch: Batch) -> torch.Tensor:
        autocast = self.compute_dtype != torch.float32
        with torch.autocast(self.device.type, self.compute_dtype, enabled=autocast):
            return self.stack.member_losses(batch).float()

    def _losses(self, batch: Batch) -> torch.Tensor:
        if self._checked:
            return self._forward(batch)
        try:  # the first micro-batch: a model vmap cannot run is one line, not a traceback
            losses = self._forward(batch)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(
                f"model: vmap cannot run it per member ({first}); remove in-place buffer "
                "updates and data-dependent control flow from its forward, or set "
                "trainer.ensemble=1"
            ) from exc
        self._checked = True
        return losses

    def _average_gradients(self) -> None:
        """DDP's mean over the ranks, as one flat all-reduce."""
        world = world_size()
        params = [p for p in self.model.parameters() if p.grad is not None]
        if world == 1 or not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """[K] grad norms, each member's over its own gradients (torch's
        clip_grad_norm_ per member: the norm of the per-tensor norms, clip coefficient
        max_norm / (norm + 1e-6) capped at 1)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        k = self.stack.num_members
        if not grads:
            return torch.zeros(k)
        per_tensor = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads])
        norms = torch.linalg.vector_norm(per_tensor, dim=0)
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.view((-1,) + (1,) * (g.dim() - 1)))
        return norms

    def eval_batch(self, batch: Batch, predictions: bool) -> EvalResult:  # noqa: ARG002
        """[K] losses of one eval batch (no predictions: an eval metric is per run)."""
        batch = to_device(batch, self.device)
        return self._forward(batch), None, None
