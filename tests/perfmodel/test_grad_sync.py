"""Gradient sync per micro-step (trainer.grad_sync) and parameters kept gathered between
micro-steps (trainer.reshard_between_micro_steps) in the memory and time model, each term by
hand on a tiny shape; and auto's choice."""

from __future__ import annotations

import dataclasses

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import GPTConfig
from toolkit.perfmodel import Layout, comm, predict
from toolkit.perfmodel.job import grad_sync_choice
from toolkit.perfmodel.steptime import fsdp_unit_collectives

# 148096 parameters: 2 blocks of 49408, a root (embeddings, final norm, head) of 49280
TINY = GPTConfig(name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256)
TOTAL = 148096
ROOMY = HardwareConfig(peak_flops_fp32=1e11, memory_bytes=1e12, matmul=[])
# 4 ranks in one node, bf16 compute, fp32 reduce, 4 micro-steps of 2 sequences
ACCUM = Layout(
    world_size=4,
    ranks_per_node=4,
    micro_batch_size=2,
    grad_accum=4,
    seq_len=64,
    param_dtype="bfloat16",
    reduce_dtype="float32",
)


def memory_of(**changes: object) -> dict:
    return predict(TINY, dataclasses.replace(ACCUM, **changes), ROOMY).memory


def test_last_keeps_the_whole_unsharded_gradient_every_only_its_shard():
    # last: every rank holds all 148096 gradients in the fp32 reduce dtype between micro-steps
    assert memory_of(grad_sync="last")["accumulated_grads_bytes"] == TOTAL * 4
    # every: the reduced fp32 shard accumulates, a quarter of it on each of 4 ranks
    assert memory_of(grad_sync="every")["accumulated_grads_bytes"] == TOTAL * 4 / 4
    # one micro-step carries nothing over, whichever mode
    assert memory_of(grad_sync="last", grad_accum=1)["accumulated_grads_bytes"] == 0
    last, every = memory_of(grad_sync="last"), memory_of(grad_sync="every")
    assert last["backward_peak_bytes"] - every["backward_peak_bytes"] == TOTAL * (4 - 1)


def test_every_reduce_scatters_each_micro_step_and_all_reduces_replicas_once():
    # 2 blocks of 300 + a root of 400, fp32, 2 shards x 2 replicas, 4 micro-steps
    units = dict(
        total=1000, block=300, blocks=2, shard_size=2, replicate=2, grad_accum=4,
        param_dtype="float32", reduce_dtype="float32", reshard_after_forward=True,
    )  # fmt: skip
    last = comm.fsdp_communication(**units)
    every = comm.fsdp_communication(**units, reductions=4)
    # a rank receives half of 1000 fp32 gradients per reduce-scatter, one per unit (3)
    assert (last["reduce_scatter_bytes"], last["reduce_scatter_calls"]) == (2000, 3)
    assert (every["reduce_scatter_bytes"], every["reduce_scatter_calls"]) == (8000, 12)
    # only the step's last reduce-scatter (the root's: 400 x 4 B / 2) stays exposed
    assert every["last_reduce_scatter_bytes"] == last["last_reduce_scatter_bytes"] == 800
    # HSDP's all-reduce of the 500-gradient shard: 2 x (1/2) x 500 x 4 B, once per step
    assert every["replica_allreduce_bytes"] == last["replica_allreduce_bytes"] == 2000
    assert every["allgather_bytes"] == last["allgather_bytes"]


def test_parameters_kept_gathered_skip_the_later_forwards_all_gathers():
    units = dict(
        total=1000, block=300, blocks=2, shard_size=2, replicate=1, grad_accum=4,
        param_dtype="float32", reduce_dtype="float32", reshard_after_forward=True,
    )  # fmt: skip
    each = comm.fsdp_communication(**units)
    kept = comm.fsdp_communication(**units, forward_gathers=1)
    # each micro-step: forward gathers 1000, backward re-gathers one block of 300; half
    # of it arrives, 4 B each
    assert (each["allgather_bytes"], each["allgather_calls"]) == (4 * 1300 * 2, 4 * 3 + 4)
    # kept: only the first forward gathers; backward still re-gathers (reshard_after_forward)
    assert (kept["allgather_bytes"], kept["allgather_calls"]) == ((1000 + 4 * 300) * 2, 3 + 4)
    assert kept["first_allgather_bytes"] == (400 + 300) * 2
    assert kept["first_allgather_calls"] == 2


def test_fsdp_copies_with_every_reduce_each_micro_step_and_add_shards():
    units = dict(
        total=1000, block=300, blocks=2, shard_size=2, grad_accum=2,
        param_dtype="float32", reduce_dtype="float32", reshard_after_forward=True,
    )  # fmt: skip
    # gathers: 2 x (1000 + 300) at (4 + 4) / 2 + 2 x 4 per element
    gathers = 2600 * 12
    # last: one reduce (chunk_cat 4 + 4, shard to fp32 (4 + 4) / 2), one unsharded add (4 + 8)
    assert comm.fsdp_copy_bytes(**units) == gathers + 1000 * 12 + 1000 * 12
    # every: two reduces, one add of the 500-element fp32 shard (read 4 + 4, write 4)
    assert comm.fsdp_copy_bytes(**units, reductions=2) == gathers + 2 * 1000 * 12 + 500 * 12


def test_unit_collectives_count_every_reduce_and_each_gather_left():
    # 2 blocks + root = 3 units, one block re-gathered in backward, 4 micro-steps
    assert fsdp_unit_collectives(TINY, dataclasses.replace(ACCUM, grad_sync="last")) == 16 + 3
    assert fsdp_unit_collectives(TINY, dataclasses.replace(ACCUM, grad_sync="every")) == 16 + 12
    kept = dataclasses.replace(ACCUM, grad_sync="last", reshard_between_micro_steps=False)
    assert fsdp_unit_collectives(TINY, kept) == 3 + 4 + 3


def test_parameters_kept_gathered_hold_the_whole_model_between_micro_steps():
    m = memory_of(grad_sync="every", reshard_between_micro_steps=False)
    assert m["held_params_bytes"] == TOTAL * 2  # every unit in bf16
    # sharded fp32 parameters, AdamW's two states and the accumulated shard, plus those
    params, optimizer = TOTAL * 4 / 4, TOTAL * 8 / 4
    expected = params + optimizer + TOTAL * 4 / 4 + TOTAL * 2
    assert m["between_micro_steps_peak_bytes"] == expected
    assert memory_of(grad_sync="every")["held_params_bytes"] == 0


def test_auto_takes_last_where_it_fits_and_every_where_only_every_fits():
    mode, why = grad_sync_choice(TINY, ACCUM, ROOMY)
    last = predict(TINY, dataclasses.replace(ACCUM, grad_sync="last"), ROOMY)
    every = predict(TINY, dataclasses.replace(ACCUM, grad_sync="every"), ROOMY)
    assert last.step_s <= every.step_s  # 4x fewer reduce-scatters, same gathers
    assert mode == "last" and "no slower" in why
    between = (last.memory["peak_bytes"] + every.memory["peak_bytes"]) / 2
    tight = dataclasses.replace(ROOMY, memory_bytes=between)
    mode, why = grad_sync_choice(TINY, ACCUM, tight)
    assert mode == "every" and "last does not fit" in why
    tiny_device = dataclasses.replace(ROOMY, memory_bytes=1.0)
    assert grad_sync_choice(TINY, ACCUM, tiny_device)[0] == "every"
    one = dataclasses.replace(ACCUM, grad_accum=1)
    assert grad_sync_choice(TINY, one, ROOMY)[0] == "every"
