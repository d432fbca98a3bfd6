"""The performance model's arithmetic, checked against values computed by hand.

Each test writes its hand computation out step by step so the formulas can be audited
without reading toolkit/perfmodel/model.py."""

from __future__ import annotations

from toolkit.config.hardware import HardwareConfig
from toolkit.config.model import GPTConfig
from toolkit.perfmodel import Layout
from toolkit.perfmodel.model import communication, flops, memory

GPT_TINY = GPTConfig(
    name="gpt_tiny", num_layers=2, dim=64, num_heads=4, vocab_size=256, max_seq_len=256
)
GPT_SMALL = GPTConfig(
    name="gpt_small", num_layers=4, dim=192, num_heads=6, vocab_size=256, max_seq_len=512
)
CPU = HardwareConfig()  # the defaults are the cpu preset
H100 = HardwareConfig(
    name="h100",
    peak_flops_fp32=67.0e12,
    peak_flops_bf16=989.0e12,
    memory_bandwidth=3.35e12,
    memory_bytes=80.0e9,
    intra_node_bandwidth=450.0e9,
    inter_node_bandwidth=50.0e9,
)

# gpt_tiny, the tests' default run: 2 ranks, fp32, micro-batch 8, sequence 128.
TINY_LAYOUT = Layout(world_size=2, ranks_per_node=2, micro_batch_size=8, grad_accum=1, seq_len=128)
# gpt_small as HSDP: 4 ranks = 2 replica groups x 2 shards (2 ranks per node, so shards talk
# within a node and replicas across nodes), bf16 compute, fp32 reduce, activation
# checkpointing, micro-batch 4, 2 accumulation steps, sequence 256.
SMALL_LAYOUT = Layout(
    world_size=4,
    ranks_per_node=2,
    micro_batch_size=4,
    grad_accum=2,
    seq_len=256,
    param_dtype="bfloat16",
    reduce_dtype="float32",
    replicate=2,
    reshard_after_forward=True,
    activation_checkpointing=True,
)

# Parameter counts by hand.
# gpt_tiny (d=64, hidden 4d=256, V=256, max_seq_len=256, L=2):
#   block     = attention 4*d^2 = 16384 + MLP 2*d*4d = 32768 + 2 LayerNorms 4*d = 256 = 49408
#   embedding = V*d + max_seq_len*d = 16384 + 16384                              = 32768
#   head      = d*V + final LayerNorm 2*d = 16384 + 128                          = 16512
#   total     = 32768 + 2*49408 + 16512                                          = 148096
TINY_BLOCK, TINY_EMB, TINY_HEAD, TINY_TOTAL = 49408, 32768, 16512, 148096
# gpt_small (d=192, hidden 768, V=256, max_seq_len=512, L=4):
#   block     = 4*192^2 = 147456 + 2*192*768 = 294912 + 4*192 = 768             = 443136
#   embedding = 256*192 + 512*192 = 49152 + 98304                               = 147456
#   head      = 192*256 + 2*192 = 49152 + 384                                   = 49536
#   total     = 147456 + 4*443136 + 49536                                       = 1969536
SMALL_BLOCK, SMALL_EMB, SMALL_HEAD, SMALL_TOTAL = 443136, 147456, 49536, 1969536


def test_parameter_counts_add_up():
    assert TINY_EMB + 2 * TINY_BLOCK + TINY_HEAD == TINY_TOTAL
    assert SMALL_EMB + 4 * SMALL_BLOCK + SMALL_HEAD == SMALL_TOTAL


def test_flops_gpt_tiny():
    # matmul parameters N = total - embedding = 148096 - 32768 = 115328
    # per token = 6*N + 12*L*d*S = 691968 + 12*2*64*128 (= 196608) = 888576
    # tokens per step = 8 sequences * 2 ranks * 128 = 2048
    f = flops(GPT_TINY, TINY_LAYOUT)
    assert f["flops_per_token"] == 888576
    assert f["model_flops_per_step"] == 888576 * 2048 == 1_819_803_648
    assert f["recompute_flops_per_step"] == 0  # no activation checkpointing
    # executed: causal attention runs half of 12*L*d*S: 691968 + 98304 = 790272 per token
    assert f["executed_flops_per_step"] == 790272 * 2048
    assert f["executed_flops_per_rank"] == 790272 * 2048 / 2


def test_flops_gpt_small_with_activation_checkpointing():
    # N = 1969536 - 147456 = 1822080
    # per token = 6*1822080 + 12*4*192*256 = 10932480 + 2359296 = 13291776
    # executed per token (causal: half the attention) = 10932480 + 1179648 = 12112128
    # recompute per token = forward of every block again: 2 * 4 * 443136 = 3545088
    #   + causal forward attention, half of 4*L*d*S = 4*4*192*256 / 2 = 393216  -> 3938304
    # tokens per step = 4 * 2 accum * 4 ranks * 256 = 8192
    f = flops(GPT_SMALL, SMALL_LAYOUT)
    assert f["flops_per_token"] == 13291776
    assert f["model_flops_per_step"] == 13291776 * 8192 == 108_886_228_992
    assert f["recompute_flops_per_step"] == 3938304 * 8192
    assert f["executed_flops_per_rank"] == (12112128 + 3938304) * 8192 / 4 == 32_871_284_736


def test_memory_gpt_tiny_fsdp_fp32():
    m = memory(GPT_TINY, TINY_LAYOUT)
    # Sharded over 2 ranks, fp32: params 148096*4/2 = 296192, grads the same, AdamW 2x.
    assert m["params_bytes"] == 296192
    assert m["grads_bytes"] == 296192
    assert m["optimizer_bytes"] == 592384
    # Gathered in fp32: root (embedding + head = 49280) + 2 blocks (current, prefetched):
    # (49280 + 2*49408) * 4 = 592384
    assert m["allgather_bytes"] == (TINY_EMB + TINY_HEAD + 2 * TINY_BLOCK) * 4 == 592384
    # Gradient staging, fp32 compute + fp32 reduce = 8 B per parameter:
    # a block 49408 * 8 = 395264, the root 49280 * 8 = 394240
    assert m["block_staging_bytes"] == 395264
    assert m["root_staging_bytes"] == 394240
    # Activations: one micro-batch = 8*128 = 1024 tokens; unit = 1024 * 64 dims * 4 B = 262144.
    # A block saves 17 units (9 + 2*mlp_ratio), 2 blocks + final norm in/out (2 units):
    # 2*17*262144 + 2*262144 = 9437184
    assert m["activations_bytes"] == 9437184
    # Cross-entropy over 1024 tokens x 256 logits x 12 B = 3145728
    assert m["logits_bytes"] == 3145728
    # Backward (no gradients of this step yet): params + AdamW + gathered + activations
    # + max(loss 3145728, block staging 395264):
    # 296192 + 592384 + 592384 + 9437184 + 3145728 = 14063872
    assert m["backward_peak_bytes"] == 14063872
    # End of backward: params + AdamW + the blocks' sharded grads (98816 * 4 / 2 = 197632)
    # + root staging: 296192 + 592384 + 197632 + 394240 = 1480448
    assert m["end_of_backward_peak_bytes"] == 1480448
    # Optimizer step: params + grads + AdamW + one temporary = 296192*3 + 592384 = 1480960
    assert m["optimizer_peak_bytes"] == 1480960
    assert m["peak_bytes"] == 14063872


def test_memory_gpt_small_hsdp_bf16_checkpointed():
    m = memory(GPT_SMALL, SMALL_LAYOUT)
    # Shard group of 2 (4 ranks / 2 replicas); state stays fp32:
    # params 1969536*4/2 = 3939072, grads the same, AdamW 7878144
    assert (m["params_bytes"], m["grads_bytes"], m["optimizer_bytes"]) == (
        3939072,
        3939072,
        7878144,
    )
    # Gathered in bf16 (2 B): (root 196992 + 2 blocks 886272) * 2 = 2166528
    assert m["allgather_bytes"] == 2166528
    # Staging: a unit's gradient in bf16 and its fp32 copy: 6 B per parameter
    assert m["block_staging_bytes"] == 443136 * 6 == 2658816
    assert m["root_staging_bytes"] == 196992 * 6 == 1181952
    # unit = 4*256 tokens * 192 * 2 B = 393216. With checkpointing: 4 block inputs (4 units)
    # + one block recomputed (17 units) + final norm in/out (2 units) = 23 units = 9043968
    assert m["activations_bytes"] == 23 * 393216 == 9043968
    assert m["logits_bytes"] == 1024 * 256 * 12 == 3145728
    # grad_accum=2: FSDP2 keeps every unsharded gradient in reduce_dtype (fp32) across
    # micro-steps: 1969536 * 4 = 7878144
    assert m["accumulated_grads_bytes"] == 7878144
    # backward: params + AdamW + gathered + activations + accumulated + max(loss, staging)
    # 3939072 + 7878144 + 2166528 + 9043968 + 7878144 + 3145728 = 34051584
    assert m["backward_peak_bytes"] == 34051584
    # end of backward: params + AdamW + block grads (4 * 443136 * 4 B / 2 = 3545088)
    # + root staging: 3939072 + 7878144 + 3545088 + 1181952 = 16544256
    assert m["end_of_backward_peak_bytes"] == 16544256
    # optimizer: 3 * 3939072 + 7878144 = 19695360
    assert m["optimizer_peak_bytes"] == 19695360
    assert m["peak_bytes"] == 34051584
    assert m["largest_term"] == "activations_bytes"


def test_activation_checkpointing_shrinks_activations():
    no_ac = memory(GPT_SMALL, Layout(4, 2, 4, 2, 256, "bfloat16", "float32", 2, True, False))
    # without checkpointing: 4 blocks * 17 units + 2 units = 70 units
    assert no_ac["activations_bytes"] == 70 * 393216


def test_communication_gpt_small_hsdp():
    c = communication(GPT_SMALL, SMALL_LAYOUT)
    # Ring collectives in a shard group of n=2: each rank receives (n-1)/n = 1/2.
    # All-gather in bf16, per micro-step: forward all 1969536 params, backward again every
    # block but the last: 3 * 443136 = 1329408. Two micro-steps:
    # 2 * (1969536 + 1329408) * 2 B * 1/2 = 6597888
    assert c["allgather_bytes"] == 6597888
    # Reduce-scatter once per step in fp32: 1969536 * 4 * 1/2 = 3939072
    assert c["reduce_scatter_bytes"] == 3939072
    # All-reduce of the rank's shard across r=2 replicas: 2*(r-1)/r * 1969536/2 * 4 = 3939072
    assert c["replica_allreduce_bytes"] == 3939072
    # Shards sit within a node (2 ranks per node), replicas across nodes.
    assert c["intra_node_bytes"] == 6597888 + 3939072
    assert c["inter_node_bytes"] == 3939072


def test_no_reshard_keeps_blocks_gathered_and_skips_backward_allgather():
    layout = Layout(2, 2, 8, 1, 128, reshard_after_forward=False)
    # all blocks stay gathered: (root 49280 + 2 blocks 98816) * 4 (same as 2 blocks here)
    assert memory(GPT_TINY, layout)["allgather_bytes"] == 148096 * 4
    # forward only: 148096 * 4 B * 1/2
    assert communication(GPT_TINY, layout)["allgather_bytes"] == 148096 * 2
