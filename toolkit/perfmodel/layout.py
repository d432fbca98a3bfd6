"""The layout a prediction is for: ranks, batch, precision, and the mesh's degrees."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """How the job is laid out over ranks and what each micro-step computes.

    The mesh is (pp, dp_replicate, dp_shard, tp) with tp varying fastest (as
    toolkit.config.parallel.MeshShape places it): a tp group is tp consecutive ranks, a
    shard group spans tp x shard_size consecutive ranks, pp is outermost."""

    world_size: int
    ranks_per_node: int
    micro_batch_size: int  # sequences per data-parallel rank per micro-step (micro-batch)
    grad_accum: int  # micro-steps per step; with pp > 1 the pipeline's micro-batches
    seq_len: int
    param_dtype: str = "float32"
    reduce_dtype: str = "float32"
    replicate: int = 1  # parallel.dp_replicate: HSDP replica groups; 1 = plain FSDP
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    pp_split: tuple[int, ...] = ()  # blocks per stage (pp x virtual); () = balanced by cost
    kernels: str = "torch"  # model.kernels: liger runs the fused linear cross-entropy
    optimizer: str = "adamw"  # optim.name: sets the optimizer state bytes per parameter
    # trainer.grad_sync resolved (toolkit.perfmodel.job.grad_sync_choice): "last" reduces
    # once per step, keeping the unsharded gradient across micro-steps; "every" reduces
    # each micro-step into the sharded gradient.
    grad_sync: str = "last"
    reshard_between_micro_steps: bool = True  # False: parameters stay gathered across them
    # optim.fused resolved: AdamW's step as one fused kernel (torch._fused_adamw_) instead of
    # ten foreach ops (toolkit.perfmodel.job.fused_optimizer)
    fused_optimizer: bool = False

    @property
    def reductions(self) -> int:
        """Reduce-scatters of each unit per step: every micro-step's, or the last's only."""
        return self.grad_accum if self.grad_sync == "every" else 1

    @property
    def keeps_unsharded_grads(self) -> bool:
        """Non-final micro-steps keep the whole unsharded gradient (grad_sync=last)."""
        return self.grad_accum > 1 and self.grad_sync == "last"

    @property
    def keeps_params_gathered(self) -> bool:
        """Non-final micro-steps keep the parameters unsharded after backward, so the next
        forward gathers nothing."""
        return self.grad_accum > 1 and not self.reshard_between_micro_steps

    @property
    def dp(self) -> int:
        """Data-parallel ranks (dp_replicate x dp_shard): each reads its own micro-batches."""
        return self.world_size // (self.tp * self.pp)

    @property
    def shard_size(self) -> int:
        """parallel.dp_shard: the FSDP shard group."""
        return self.dp // self.replicate

    @property
    def virtual_stages(self) -> int:
        return self.pp_virtual_stages if self.pp_schedule == "interleaved_1f1b" else 1

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all ranks (tp and pp peers share theirs)."""
        return self.micro_batch_size * self.grad_accum * self.dp * self.seq_len

    @property
    def shard_within_node(self) -> bool:
        return self.tp * self.shard_size <= self.ranks_per_node

    @property
    def tp_within_node(self) -> bool:
        return self.tp <= self.ranks_per_node

    @property
    def pp_within_node(self) -> bool:
        """Neighbouring stages sit tp x dp ranks apart: inside a node only when the whole
        pipeline is."""
        return self.world_size <= self.ranks_per_node
