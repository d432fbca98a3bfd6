"""Hardware profiles: the loader's validation, the measurement arithmetic, the presets."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import ConfigError
from toolkit.config.hardware import GemmPoint, HardwareConfig, load_profile, problems
from toolkit.perfmodel import profile


def write_profile(tmp_path, hw: HardwareConfig, drop: str = ""):
    text = profile.profile_yaml(hw, ["test profile"])
    if drop:
        text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{drop}:"))
    path = tmp_path / "measured.yaml"
    path.write_text(text)
    return path


def test_a_written_profile_loads_back_equal(tmp_path):
    hw = HardwareConfig(
        name="box", cores_per_node=2, matmul=[GemmPoint(64, 64, 64, "float32", 0.5)]
    )
    assert load_profile(write_profile(tmp_path, hw)) == hw


def test_a_profile_missing_a_field_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_profile(write_profile(tmp_path, HardwareConfig(), drop="memory_bandwidth"))
    assert len(err.value.problems) == 1
    assert "missing field(s) memory_bandwidth" in err.value.problems[0]


def test_a_profile_measured_before_the_per_step_latencies_existed_still_loads(tmp_path):
    hw = HardwareConfig(name="old", intra_node_latency_s=2e-5)
    text = profile.profile_yaml(hw, ["measured before the fields existed"])
    old = [line for line in text.splitlines() if "_step_latency_s:" not in line]
    path = tmp_path / "old.yaml"
    path.write_text("\n".join(old))
    loaded = load_profile(path)
    assert (loaded.intra_node_step_latency_s, loaded.inter_node_step_latency_s) == (0.0, 0.0)
    assert loaded.intra_node_latency_s == 2e-5


def test_a_profile_with_a_bad_fraction_names_the_entry(tmp_path):
    hw = HardwareConfig(matmul=[GemmPoint(64, 64, 64, "float32", 1.5)])
    with pytest.raises(ConfigError) as err:
        load_profile(write_profile(tmp_path, hw))
    assert err.value.problems == [
        f"{tmp_path / 'measured.yaml'}: hardware.matmul[0].fraction=1.5: must be in (0, 1]"
    ]


def test_latency_and_bandwidth_from_two_message_sizes():
    # 1 kB in 0.1 ms, 1 MB in 1.099 ms: slope 0.999 ms / 999 kB = 1 ns/B -> 1 GB/s
    latency, bandwidth = profile.latency_bandwidth([(1e6, 1.099e-3), (1e3, 1e-4)])
    assert latency == 1e-4
    assert bandwidth == pytest.approx(1e9)


def test_bandwidth_through_fsdp_is_bytes_over_the_time_fsdp_adds():
    # 1e8 B moved, FSDP added 1.2 s of which 0.2 s are per-call latency and overhead
    assert profile.fsdp_bandwidth(1e8, 1.2, 0.2, raw=1e9) == pytest.approx(1e8)
    assert profile.fsdp_bandwidth(1e8, 0.1, 0.2, raw=1e9) == 1e9  # lost in noise: raw
    assert profile.fsdp_bandwidth(1e8, 0.02, 0.01, raw=1e9) == 1e9  # never above raw


def test_rates_become_fractions_of_the_best_rate():
    table = profile.gemm_table([(64, 64, 64, "float32", 5e10)], {"float32": 1e11})
    assert table == [GemmPoint(64, 64, 64, "float32", 0.5)]
    # 8 heads, S=128, h=64: QK^T and AV 2*128*128*64 each = 4194304 forward, x3 with
    # backward, causal half: 0.5 * 3 * 2 * 2097152 * 8 = 50331648
    assert profile.causal_sdpa_flops(8, 128, 64) == 50331648


@pytest.mark.parametrize("name", ["a100", "h100", "h200", "cpu"])
def test_presets_validate_and_gpu_presets_carry_fraction_tables(name):
    hw = to_job(compose_raw([f"hardware={name}"])).hardware
    assert problems(hw) == []
    assert hw.source
    if name != "cpu":
        assert hw.matmul and hw.attention and hw.nics_per_node == 8
        assert hw.matmul_fraction(8192, 8192, 8192, "bfloat16") < 1.0


def test_every_number_must_be_positive():
    bad = dataclasses.replace(HardwareConfig(), memory_bandwidth=0.0, op_overhead_s=-1.0)
    assert problems(bad) == [
        "hardware.memory_bandwidth=0.0: must be > 0",
        "hardware.op_overhead_s=-1.0: must be >= 0",
    ]


@pytest.mark.slow
def test_attention_is_measured_at_each_head_dim_the_presets_use():
    import torch

    from toolkit.measure.kernel_rates import attention_rates

    rates = attention_rates(torch.device("cpu"), ["float32"], (16,), (16, 32))
    assert [(s, h, d) for s, h, d, _ in rates] == [(16, 16, "float32"), (16, 32, "float32")]
    assert all(r > 0 for *_, r in rates)
    table = profile.attention_table(rates, {"float32": max(r for *_, r in rates)})
    assert {p.head_dim for p in table} == {16, 32} and max(p.fraction for p in table) == 1.0


def test_the_gemms_of_a_preset_are_its_layers_forward_and_backward_shapes():
    from toolkit.measure.kernel_rates import model_gemm_shapes

    shapes = model_gemm_shapes("gpt_tiny:64")  # dim 64, mlp 256, vocabulary 256, 64 tokens
    # qkv forward (64 tokens, 3*64 out, 64 in) and its two backward GEMMs: dx, dW
    assert {(64, 192, 64), (64, 64, 192), (192, 64, 64)} <= set(shapes)
    assert (64, 256, 64) in shapes  # fc forward (and the head's: vocabulary 256)
    assert len(shapes) == len(set(shapes))  # each shape measured once


def test_a_bad_preset_for_gemms_of_is_one_line(tmp_path, capsys):
    from toolkit.measure.hardware import main

    assert main(["--dir", str(tmp_path), "--gemms-of", "gpt_nope:64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --gemms-of gpt_nope:64")


def test_a_profile_records_its_speed_probe_and_the_presets_have_none(tmp_path):
    hw = HardwareConfig(name="box", probe_s=0.0078)
    assert load_profile(write_profile(tmp_path, hw)).probe_s == 0.0078
    assert to_job(compose_raw(["hardware=h100"])).hardware.probe_s == 0.0


def test_the_speed_probe_times_one_thread_and_leaves_the_thread_count_alone():
    import torch

    from toolkit.measure.kernel_rates import speed_probe
    from toolkit.measure.model_check import probe_ratio

    threads = torch.get_num_threads()
    assert speed_probe(torch.device("cpu")) > 0
    assert torch.get_num_threads() == threads
    assert probe_ratio(0.0) is None  # a profile without a probe: no drift to report
    assert probe_ratio(1e9) < 1  # a huge recorded time: the machine is "faster" now
