"""What a step costs beyond its arithmetic (issue 45 item 3): the optimizer's kernels
(optim.fused), TF32 for fp32 matmuls (precision.tf32) and CUDA graphs for compiled blocks
(parallel.cuda_graphs). On a CPU nothing changes by default; what torch runs on a CPU (the
fused AdamW and SGD steps, the default compile mode) is tested here, the CUDA side in
scripts/gpu_check.sh (its "overhead" step)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from toolkit.config.compose import compose_raw, to_job
from toolkit.config.errors import switch
from toolkit.config.optim import OptimConfig
from toolkit.config.parallel import ParallelConfig
from toolkit.config.precision import PrecisionConfig
from toolkit.config.validate import problems
from toolkit.distributed.step_overhead import apply_step_settings, compile_mode, cuda_graphs
from toolkit.train.optim import build_optimizer, step_kernels

CPU = torch.device("cpu")


def kernels_of(optimizer: torch.optim.Optimizer) -> tuple[bool, bool]:
    """(fused, foreach) as the optimizer was built."""
    return bool(optimizer.defaults.get("fused")), bool(optimizer.defaults.get("foreach"))


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("auto", (False, True)),  # a CPU model: foreach, as before
        ("on", (True, False)),  # torch has a fused AdamW for the CPU
        ("off", (False, True)),
        ("True", (True, False)),  # Hydra's spelling of optim.fused=true in a str field
        ("False", (False, True)),
    ],
)
def test_optim_fused_picks_adamws_kernels(setting, expected, caplog):
    with caplog.at_level(logging.INFO, logger="toolkit.train.optim"):
        optimizer = build_optimizer(nn.Linear(4, 8), OptimConfig(fused=setting))
    assert kernels_of(optimizer) == expected
    kind = "fused" if expected[0] else "foreach"
    assert f"optimizer: AdamW on cpu, {kind} kernels" in caplog.text


def test_auto_means_fused_on_cuda_and_foreach_elsewhere():
    # The choice itself, for each device: on a CUDA machine auto is fused=True.
    assert step_kernels(torch.optim.AdamW, "auto", torch.device("cuda")) == {"fused": True}
    assert step_kernels(torch.optim.AdamW, "auto", CPU) == {"foreach": True}
    assert step_kernels(torch.optim.SGD, "auto", torch.device("cuda")) == {"fused": True}
    # RAdam has foreach kernels only; LBFGS neither keyword
    assert step_kernels(torch.optim.RAdam, "on", torch.device("cuda")) == {"foreach": True}
    assert step_kernels(torch.optim.LBFGS, "auto", torch.device("cuda")) == {}


def test_fused_and_foreach_steps_train_alike_on_the_cpu():
    # Same start, same gradients: the fused CPU kernel and foreach agree to fp32 rounding.
    weights = []
    for fused in ("on", "off"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 1))
        optimizer = build_optimizer(model, OptimConfig(fused=fused, lr=1e-2))
        for i in range(5):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5, atol=1e-6)


def test_a_torch_optimizer_by_path_gets_the_kernel_keyword_unless_it_names_its_own():
    model = nn.Linear(4, 8)
    sgd = build_optimizer(model, to_job(compose_raw(["optim=sgd", "optim.fused=on"])).optim)
    assert kernels_of(sgd) == (True, False)
    sgd = build_optimizer(model, to_job(compose_raw(["optim=sgd"])).optim)
    assert kernels_of(sgd) == (False, True)  # auto on a CPU
    own = ["optim._target_=torch.optim.Adam", "+optim.foreach=false", "optim.fused=on"]
    assert kernels_of(build_optimizer(model, to_job(compose_raw(own)).optim)) == (False, False)


def test_bad_switches_are_one_line_each_before_any_rank_starts():
    job = to_job(
        compose_raw(["optim.fused=fast", "parallel.cuda_graphs=maybe", "precision.tf32=false"])
    )
    found = problems(job)
    assert "optim.fused=fast: unknown; allowed: auto, on, off" in found
    assert "parallel.cuda_graphs=maybe: unknown; allowed: auto, on, off" in found
    assert not any("tf32" in line for line in found)
    job = to_job(compose_raw(["parallel.cuda_graphs=on"]))  # compile is off
    assert problems(job) == [
        "parallel.cuda_graphs=on needs parallel.compile=true: the CUDA graphs are "
        "torch.compile's (reduce-overhead mode over each block)"
    ]
    job = to_job(compose_raw(["optim=adamw8bit", "optim.fused=on"]))
    assert problems(job) == [
        "optim.fused=on: adamw8bit's step is torchao's (optim.compile_step compiles it); "
        "use optim.fused=auto or off"
    ]
    assert problems(to_job(compose_raw(["parallel.compile=true", "parallel.cuda_graphs=on"]))) == []


def test_yaml_booleans_read_as_on_and_off():
    assert [switch(v) for v in (True, False, "ON", "auto", "2")] == [
        "on",
        "off",
        "on",
        "auto",
        None,
    ]


def test_on_a_cpu_tf32_and_cuda_graphs_stay_off_and_the_lines_say_why():
    before = torch.get_float32_matmul_precision()
    par = ParallelConfig(compile=True, cuda_graphs="on")
    lines = apply_step_settings(PrecisionConfig(tf32=True), par, CPU)
    assert lines == [
        "tf32: off (a CPU: fp32 matmuls run in full fp32)",
        "cuda_graphs: off (parallel.cuda_graphs=on is ignored on cpu)",
    ]
    assert torch.get_float32_matmul_precision() == before  # nothing set on a CPU
    assert compile_mode(par, "cpu") is None  # the CPU compiles in torch's default mode


@pytest.mark.parametrize(
    ("compile", "setting", "on", "why"),
    [
        (True, "on", True, "each compiled block in torch.compile's reduce-overhead mode"),
        (True, "auto", False, "auto: not yet measured with FSDP2 on a GPU"),
        (False, "auto", False, "auto: they come with parallel.compile=true"),
        (True, "off", False, "parallel.cuda_graphs=off"),
    ],
)
def test_cuda_graphs_on_a_cuda_device(compile, setting, on, why):
    par = ParallelConfig(compile=compile, cuda_graphs=setting)
    graphs, line = cuda_graphs(par, "cuda")
    assert graphs is on and why in line
    assert compile_mode(par, "cuda") == ("reduce-overhead" if on else None)


def test_a_training_rank_says_each_choice_in_its_first_lines(single_rank_group, tmp_path, caplog):
    from toolkit.distributed.env import DistEnv
    from toolkit.tasks.train import build_trainer

    job = to_job(compose_raw(["model=gpt_tiny", "data.seq_len=32", "trainer.steps=1"]))
    env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0)
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(job, env, tmp_path, CPU)
    trainer.sink.close()
    trainer.watch.uninstall()
    text = caplog.text
    assert "tf32: off (a CPU" in text
    assert "cuda_graphs: off (auto: CUDA graphs need a CUDA device, this is cpu)" in text
    assert "optimizer: AdamW on cpu, foreach kernels (optim.fused=auto" in text
