"""The compute side from kernel-level sources: the GEMM size ramp (tile and wave
quantization, the memory bound), attention by masking, the presets' sourced attention table,
and a measured profile replacing the ramp. Every value is worked out by hand in a comment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.hardware import AttentionPoint, GemmPoint, HardwareConfig, load_profile
from toolkit.config.model import GPTConfig
from toolkit.perfmodel import kernels, profile
from toolkit.perfmodel.__main__ import main as perfmodel


def gpu(num_sms: int = 4, memory_bandwidth: float = 1e13) -> HardwareConfig:
    return HardwareConfig(
        peak_flops_bf16=1e15,
        memory_bandwidth=memory_bandwidth,
        num_sms=num_sms,
        matmul=[GemmPoint(16384, 16384, 16384, "bfloat16", 0.5)],
    )


def test_wave_efficiency_takes_the_tile_that_fills_the_sms_best():
    # 1024 x 1024 on 132 SMs: 256x128 tiles: 4*8 = 32 tiles, one wave,
    # 1024^2 / (132 * 32768) = 0.2424; 128x128: 64 tiles, one wave,
    # 1048576 / (132 * 16384) = 0.4848 (the best)
    assert kernels.wave_efficiency(1024, 1024, 132) == pytest.approx(1048576 / (132 * 16384))
    # 384 x 384 on 4 SMs: 128x128: 9 tiles, 3 waves, 147456 / (3 * 4 * 16384) = 0.75;
    # 256x128: 2*3 = 6 tiles, 2 waves, 147456 / (2 * 4 * 32768) = 0.5625
    assert kernels.wave_efficiency(384, 384, 4) == pytest.approx(0.75)
    # 16384^2 on 132 SMs: 128x128: 16384 tiles in 125 waves,
    # 268435456 / (125 * 132 * 16384) = 0.99297; 256x128: 8192 tiles in 63 waves, 0.98509
    assert kernels.wave_efficiency(16384, 16384, 132) == pytest.approx(
        268435456 / (125 * 132 * 16384)
    )


def test_a_gemm_runs_at_the_ceiling_times_its_wave_efficiency():
    # 256 x 256 x 4096 on 4 SMs: 4 tiles of 128x128, one full wave (efficiency 1);
    # 2*256*256*4096 = 536870912 FLOPs at 1e15 * 0.5 = 1.0737e-6 s; its bytes
    # (256*4096 + 4096*256 + 256*256) * 2 = 4325376 at 1e13 B/s = 4.3e-7 s: compute bound
    assert kernels.gemm_seconds(256, 256, 4096, "bfloat16", gpu()) == pytest.approx(
        536870912 / 5e14
    )
    # 384 x 384 x 4096: wave efficiency 0.75, 2*384*384*4096 = 1207959552 FLOPs
    # at 5e14 * 0.75 = 3.2212e-6 s
    assert kernels.gemm_seconds(384, 384, 4096, "bfloat16", gpu()) == pytest.approx(
        1207959552 / (5e14 * 0.75)
    )


def test_a_thin_gemm_takes_at_least_its_bytes_at_memory_bandwidth():
    # 256 x 256 x 64: compute 2*256*256*64 / 5e14 = 1.68e-8 s; bytes
    # (256*64 + 64*256 + 256*256) * 2 = 196608 at 1e13 = 1.97e-8 s: memory bound
    assert kernels.gemm_seconds(256, 256, 64, "bfloat16", gpu()) == pytest.approx(196608 / 1e13)


def test_a_measured_table_is_taken_as_it_is():
    # num_sms 0 (a measured profile: each shape's own rate is in its table): no ramp,
    # 2*384*384*4096 / 5e14, though the same shape on 4 SMs would lose a quarter to waves
    measured = gpu(num_sms=0)
    assert kernels.gemm_seconds(384, 384, 4096, "bfloat16", measured) == pytest.approx(
        1207959552 / 5e14
    )


def test_a_measured_profile_has_no_ramp_and_replaces_the_preset(tmp_path):
    h100 = to_job(compose_raw(["hardware=h100"])).hardware
    table = [GemmPoint(1024, 1024, 1024, "bfloat16", 0.4)]
    measured = HardwareConfig(name="box", peak_flops_bf16=h100.peak_flops_bf16, matmul=table)
    path = tmp_path / "box.yaml"
    path.write_text(profile.profile_yaml(measured, ["measured"]))
    loaded = load_profile(path)
    assert loaded.num_sms == 0 and h100.num_sms == 132
    # 2 * 1024^3 = 2147483648 FLOPs at 989e12 * 0.4, the measured rate, no wave factor
    assert kernels.gemm_seconds(1024, 1024, 1024, "bfloat16", loaded) == pytest.approx(
        2147483648 / (989e12 * 0.4)
    )


def test_attention_uses_the_points_of_its_own_masking():
    hw = HardwareConfig(
        peak_flops_bf16=1e15,
        attention=[
            AttentionPoint(2048, 128, "bfloat16", 0.25, causal=True),
            AttentionPoint(2048, 128, "bfloat16", 0.5, causal=False),
        ],
    )
    assert hw.attention_fraction(2048, 128, "bfloat16", causal=True) == 0.25
    assert hw.attention_fraction(2048, 128, "bfloat16", causal=False) == 0.5
    # a table with only causal points answers for non-causal too
    causal_only = HardwareConfig(attention=[AttentionPoint(512, 64, "bfloat16", 0.2)])
    assert causal_only.attention_fraction(512, 64, "bfloat16", causal=False) == 0.2
    # The model's causal SDPA: one block, dim 256 (2 heads of 128), 2048 tokens of S=2048:
    # 0.5 * 12 * 256 * 2048 * 2048 = 6442450944 FLOPs at 1e15 * 0.25 (the causal point)
    model = GPTConfig(num_layers=1, dim=256, num_heads=2)
    seconds = kernels.block_attention_s(model, 2048, 2048, "bfloat16", hw, recompute=False)
    assert seconds == pytest.approx(6442450944 / 2.5e14)


@pytest.mark.parametrize(
    ("name", "seq_len", "head_dim", "causal", "tflops", "peak"),
    [
        # FlashAttention-2 README figures, forward + backward, FP16/BF16
        ("h100", 2048, 128, True, 265, 989e12),  # H100 panel (d)
        ("h100", 8192, 64, False, 294, 989e12),  # H100 panel (a)
        ("h200", 2048, 128, True, 265, 989e12),  # the H100 figure: same SMs and clocks
        ("a100", 4096, 128, True, 173, 312e12),  # A100 panel (d)
    ],
)
def test_the_gpu_presets_attention_is_flash_attention_2s_published_figure(
    name, seq_len, head_dim, causal, tflops, peak
):
    # The figure counts backward as 2.5x forward, the model as 2x: fraction = 3/3.5 x
    # TFLOPs/s / peak, e.g. H100 causal d128 S=2048: 3 * 265 / (3.5 * 989) = 0.2297
    hw = to_job(compose_raw([f"hardware={name}"])).hardware
    fraction = hw.attention_fraction(seq_len, head_dim, "bfloat16", causal)
    assert fraction == pytest.approx(3 * tflops * 1e12 / (3.5 * peak), abs=5e-4)


@pytest.mark.parametrize(
    ("name", "m", "n", "k", "mamf"),
    [
        # The MAMF table (ml-engineering, compute/accelerator/README.md): best shape, TFLOPs/s
        ("h100", 2048, 2048, 13312, 794.5e12),
        ("h200", 2048, 2048, 13312, 794.5e12),  # "H200 is the same"
        ("a100", 1024, 10240, 5120, 271.2e12),
    ],
)
def test_the_gpu_presets_reproduce_the_published_matmul_rate_at_its_shape(name, m, n, k, mamf):
    # ceiling = MAMF / peak / wave efficiency of that shape, e.g. H100: 794.5 / 989 = 0.8033,
    # 2048 x 2048 on 132 SMs: 256 tiles of 128x128 in 2 waves, 4194304 / (2*132*16384) =
    # 0.9697, ceiling 0.828 (rounded in the YAML); so 2mnk / seconds = MAMF within 0.1 %
    hw = to_job(compose_raw([f"hardware={name}"])).hardware
    rate = 2.0 * m * n * k / kernels.gemm_seconds(m, n, k, "bfloat16", hw)
    assert rate == pytest.approx(mamf, rel=1e-3)


def test_small_gemms_on_a_gpu_preset_run_far_below_large_ones():
    # H100, 1024 x 256 x 256: 16 tiles of 128x128 fill 16 of 132 SMs (the best tile):
    # 1024 * 256 / (132 * 16384) = 0.1212, x the ceiling 0.828 = 0.1004 of peak (bytes 1179648 at 3.35e12 = 0.35 us,
    # compute 134217728 / (989e12 * 0.1004) = 1.35 us: compute bound)
    hw = to_job(compose_raw(["hardware=h100"])).hardware
    small = 2.0 * 1024 * 256 * 256 / kernels.gemm_seconds(1024, 256, 256, "bfloat16", hw)
    assert small / hw.peak_flops_bf16 == pytest.approx(0.828 * 262144 / (132 * 16384))


def test_perfmodel_predicts_from_a_measured_gpu_profile_instead_of_the_preset(tmp_path, capsys):
    # A profile as toolkit.measure.hardware writes it for this GPU: the preset's datasheet
    # numbers, its own one-point tables, num_sms 0. Halving the measured GEMM rate doubles
    # the gemm term exactly (no ramp, no ceiling), and the preset's own ramp gives neither.
    h100 = to_job(compose_raw(["hardware=h100"])).hardware
    (tmp_path / "hardware").mkdir()
    for name, fraction in (("fast", 0.8), ("slow", 0.4)):
        measured = dataclasses.replace(
            h100,
            name=name,
            num_sms=0,
            matmul=[GemmPoint(4096, 4096, 4096, "bfloat16", fraction)],
            attention=[AttentionPoint(2048, 64, "bfloat16", fraction / 2)],
        )
        (tmp_path / "hardware" / f"{name}.yaml").write_text(
            profile.profile_yaml(measured, ["measured"])
        )
    terms = {}
    for name in ("fast", "slow", "h100"):
        args = ["-cd", str(tmp_path), "--json", "model=gpt_small", "precision=bf16"]
        assert perfmodel([*args, f"hardware={name}"]) == 0
        terms[name] = json.loads(capsys.readouterr().out)["time"]
    assert terms["slow"]["gemm_s"] == pytest.approx(2 * terms["fast"]["gemm_s"])
    assert terms["slow"]["attention_s"] == pytest.approx(2 * terms["fast"]["attention_s"])
    assert terms["h100"]["gemm_s"] != pytest.approx(terms["fast"]["gemm_s"])


def test_a_profile_measured_before_num_sms_and_causal_existed_still_loads(tmp_path):
    # An older profile has neither `num_sms` nor `causal` in its attention points: it loads
    # with num_sms 0 (its table as it is) and causal points (what kernel_rates measures).
    hw = HardwareConfig(name="old", attention=[AttentionPoint(512, 64, "float32", 0.4)])
    text = profile.profile_yaml(hw, ["measured before the fields existed"])
    old = [line for line in text.splitlines() if "num_sms:" not in line and "causal:" not in line]
    path = tmp_path / "old.yaml"
    path.write_text("\n".join(old))
    loaded = load_profile(path)
    assert loaded.num_sms == 0
    assert loaded.attention == [AttentionPoint(512, 64, "float32", 0.4, causal=True)]
