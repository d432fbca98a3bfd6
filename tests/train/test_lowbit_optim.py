"""Low-bit AdamW (optim=adamw8bit | adamw_lowmem): the update against fp32 AdamW, the state's
real size, the checkpoint boundary (plain fp32 out, the same dequantised values back in),
and a 2-rank run of the real CLI that trains, resumes bitwise and reshards 2 -> 1."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn
from torchao.optim.subclass_4bit import OptimState4bit
from torchao.optim.subclass_8bit import OptimState8bit

from tests.checkpoint.conftest import CKPT, launch, losses
from toolkit.checkpoint.trust import MetadataUnpickler
from toolkit.config.optim import OptimConfig
from toolkit.train.lowbit import build_lowbit, local_state_bytes, state_bytes_per_param
from toolkit.train.lowbit_state import is_low_bit, quantize_exactly
from toolkit.train.optim import build_optimizer, build_scheduler

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

LOW_BIT = ("adamw8bit", "adamw_lowmem")
LR = 1e-2


def low_bit(name: str, params: list[torch.Tensor], compile_step: bool = False):
    groups = [{"params": params, "weight_decay": 0.1}]
    return build_lowbit(groups, name, lr=LR, betas=(0.9, 0.95), eps=1e-8, compile_step=compile_step)


def pair(name: str) -> tuple[list[torch.Tensor], list]:
    """The same start point under fp32 AdamW and under `name`."""
    torch.manual_seed(0)
    w0 = torch.randn(64, 256)
    ws = [w0.clone().requires_grad_(), w0.clone().requires_grad_()]
    ref = torch.optim.AdamW([ws[0]], lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    return ws, [ref, low_bit(name, [ws[1]])]


def step(ws: list[torch.Tensor], optimizers: list, i: int, target: torch.Tensor) -> None:
    """One step of a noisy quadratic, the same gradient noise for every optimizer."""
    noise = torch.randn(target.shape, generator=torch.Generator().manual_seed(i))
    for w, o in zip(ws, optimizers, strict=True):
        o.zero_grad()
        (((w - target) ** 2).mean() + 0.1 * (w * noise).mean()).backward()
        o.step()


@pytest.mark.parametrize("name", LOW_BIT)
def test_the_first_step_is_fp32_adamw(name):
    # The step updates with fp32 m and v and quantises them only afterwards: step 1 differs
    # from torch.optim.AdamW by fp32 rounding only (another order of the same operations).
    ws, optimizers = pair(name)
    step(ws, optimizers, 0, torch.zeros(64, 256))
    torch.testing.assert_close(ws[1], ws[0], rtol=1e-6, atol=1e-7)
    assert is_low_bit(optimizers[1].state[ws[1]]["exp_avg"])


@pytest.mark.parametrize(("name", "min_cosine"), [("adamw8bit", 0.999), ("adamw_lowmem", 0.9)])
def test_twenty_steps_follow_fp32_adamw(name, min_cosine):
    # From step 2 on, m and v carry the quantisation error of their format. The tolerance is
    # the direction of the total displacement against fp32 AdamW's: 8-bit codes are within
    # ~1 % of each element (measured cosine 0.9997); 4-bit ones are coarse (16 values per
    # block; v's table has no zero, so small v are over-estimated and their steps shortened:
    # measured cosine 0.945) and still move the same way.
    ws, optimizers = pair(name)
    start = ws[0].detach().clone()
    target = torch.randn(64, 256, generator=torch.Generator().manual_seed(99))
    for i in range(20):
        step(ws, optimizers, i, target)
    moved = [(w.detach() - start).flatten() for w in ws]
    assert torch.cosine_similarity(moved[0], moved[1], dim=0) >= min_cosine
    assert (ws[1] - target).norm() < 1.02 * (ws[0] - target).norm()  # got as close as fp32


@pytest.mark.parametrize("name", LOW_BIT)
def test_state_bytes_per_param_come_from_the_real_state_tensors(name):
    big, small = torch.zeros(1024, 256, requires_grad=True), torch.zeros(64, requires_grad=True)
    o = low_bit(name, [big, small])
    (big.sum() + small.sum()).backward()
    o.step()
    small_bytes = 2 * 64 * 4  # < 4096 elements: fp32 m and v, like bitsandbytes
    code_tables = 2 * o.state[big]["exp_avg"].qmap.numel() * 4  # one table per state tensor
    measured = (local_state_bytes(o) - small_bytes - code_tables) / big.numel()
    assert measured == state_bytes_per_param(name)
    assert {"adamw": 8.0, "adamw8bit": 2.03125, "adamw_lowmem": 1.0625}[name] == (
        state_bytes_per_param(name)
    )


def test_state_bytes_per_param_of_fp32_adamw():
    assert state_bytes_per_param("adamw") == 8.0


@pytest.mark.parametrize("name", LOW_BIT)
def test_the_saved_state_is_plain_fp32_and_a_reload_continues_bitwise(name):
    ws, optimizers = pair(name)
    low, w = optimizers[1], ws[1]
    target = torch.randn(64, 256, generator=torch.Generator().manual_seed(99))
    for i in range(5):
        step(ws, optimizers, i, target)
    saved = copy.deepcopy(low.state_dict())
    assert {type(v) for v in saved["state"][0].values()} == {torch.Tensor}
    assert saved["state"][0]["exp_avg"].dtype == torch.float32
    assert is_low_bit(low.state[w]["exp_avg"])  # the optimizer's own state is untouched

    twin = w.detach().clone().requires_grad_()
    reloaded = low_bit(name, [twin])
    reloaded.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq"):
        assert is_low_bit(reloaded.state[twin][key])
        assert torch.equal(reloaded.state[twin][key].dequantize(), low.state[w][key].dequantize())
    for i in range(5, 8):
        step([w, twin], [low, reloaded], i, target)
    assert torch.equal(w, twin)


@pytest.mark.parametrize(("cls", "block"), [(OptimState8bit, 256), (OptimState4bit, 128)])
def test_quantize_exactly_recovers_blocks_whose_largest_element_is_negative(cls, block):
    # The library's copy_ takes max |value| as the scale; a block whose extreme is negative
    # dequantised to 0.99.. x scale, so copy_ of the dequantised values picks other codes.
    values = torch.randn(16, block, generator=torch.Generator().manual_seed(1))
    values[:, 0] = -10.0  # every block's largest |value| is negative
    state = cls.zeros((16, block), True, block)
    state.copy_(values)
    dequantised = state.dequantize()
    by_library = cls.zeros((16, block), True, block)
    by_library.copy_(dequantised)
    assert not torch.equal(by_library.dequantize(), dequantised)
    exact = cls.zeros((16, block), True, block)
    assert quantize_exactly(exact, dequantised) == 0
    assert torch.equal(exact.dequantize(), dequantised)


def test_values_from_other_blocks_are_rounded_and_counted():
    state = OptimState8bit.zeros((16, 256), True, 256)
    assert quantize_exactly(state, torch.randn(16, 256)) == 16  # not from any 8-bit state


@pytest.mark.parametrize("name", LOW_BIT)
def test_lr_stays_a_float_and_follows_the_schedule_of_adamw(name):
    lrs = {}
    for optim in ("adamw", name):
        torch.manual_seed(0)
        model = nn.Linear(64, 128)
        cfg = OptimConfig(name=optim, warmup_steps=2)
        o = build_optimizer(model, cfg)
        sched = build_scheduler(o, cfg, total_steps=6)
        seen = []
        for _ in range(6):
            model(torch.randn(4, 64)).sum().backward()
            o.step()
            sched.step()
            seen.append(o.param_groups[0]["lr"])
        lrs[optim] = seen
    assert all(isinstance(lr, float) for lr in lrs[name])
    assert lrs[name] == lrs["adamw"]


@pytest.mark.parametrize(
    ("setting", "compiled"), [("auto", False), ("True", True), ("true", True), ("false", False)]
)
def test_compile_step_auto_compiles_on_cuda_only(setting, compiled):
    # 'True': what Hydra makes of optim.compile_step=true in a str field.
    cfg = OptimConfig(name="adamw8bit", compile_step=setting)
    assert build_optimizer(nn.Linear(64, 128), cfg).compile_step is compiled  # a CPU model


@pytest.mark.slow
@pytest.mark.parametrize("name", LOW_BIT)
def test_the_compiled_step_matches_the_eager_one(name):
    # What CUDA runs (torch.compile of the library's update) against what CPU runs (eager).
    # Inductor fuses and reorders fp32 arithmetic: equal to within fp32 rounding, not bitwise.
    results = []
    for compile_step in (False, True):
        torch.manual_seed(0)
        w = torch.randn(64, 256, requires_grad=True)
        o = low_bit(name, [w], compile_step)
        t0 = time.perf_counter()
        for i in range(3):
            o.zero_grad()
            (w * torch.randn(64, 256, generator=torch.Generator().manual_seed(i))).sum().backward()
            o.step()
        print(f"{name} compile_step={compile_step}: 3 steps {time.perf_counter() - t0:.1f} s")
        results.append(w.detach())
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)


# -- the real CLI: 2 ranks, gpt_tiny, optim=adamw8bit ----------------------------------
LOWBIT = ["optim=adamw8bit", *CKPT]


@pytest.fixture(scope="module")
def lowbit_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lowbit") / "run"
    done = launch(run_dir, *LOWBIT)
    assert done.returncode == 0, done.stderr
    return run_dir


def test_a_two_rank_adamw8bit_run_trains(lowbit_run):
    loss = losses(lowbit_run)
    assert sorted(loss) == list(range(1, 9))
    assert loss[8] < loss[1] - 0.3  # gpt_tiny on text: 5.55 -> 5.01 in 8 steps


def test_its_checkpoint_holds_plain_fp32_states_readable_by_the_trusted_loader(lowbit_run):
    path = lowbit_run / "checkpoints" / "step-00000006" / ".metadata"
    with path.open("rb") as f:
        metadata = MetadataUnpickler(f, path).load()  # refuses anything but DCP types
    states = {
        k: v
        for k, v in metadata.state_dict_metadata.items()
        if k.startswith("optim.state.") and k.endswith(("exp_avg", "exp_avg_sq"))
    }
    assert states
    assert {v.properties.dtype for v in states.values()} == {torch.float32}
    emb = [v for k, v in states.items() if "emb" in k and k.endswith(".exp_avg")]
    assert emb and list(emb[0].size) == [256, 64]  # the whole tensor: reshardable


@pytest.mark.slow
def test_a_resume_on_two_ranks_continues_bitwise(lowbit_run, tmp_path):
    source = lowbit_run / "checkpoints" / "step-00000006"
    done = launch(tmp_path / "two", *LOWBIT, f"checkpoint.resume_from={source}")
    assert done.returncode == 0, done.stderr
    resumed = losses(tmp_path / "two")
    assert sorted(resumed) == [7, 8]
    assert resumed == {s: losses(lowbit_run)[s] for s in (7, 8)}  # the same floats


@pytest.mark.slow
def test_a_two_rank_adamw8bit_checkpoint_loads_on_one_rank(lowbit_run, tmp_path):
    source = lowbit_run / "checkpoints" / "step-00000006"
    run_dir = tmp_path / "one"
    done = launch(run_dir, *LOWBIT, f"checkpoint.resume_from={source}", "cluster.tasks_per_node=1")
    assert done.returncode == 0, done.stderr
    reference = losses(lowbit_run)
    resumed = losses(run_dir)
    assert sorted(resumed) == [7, 8]
    for step_, loss in resumed.items():
        assert loss == pytest.approx(reference[step_], abs=1e-4)  # reduction order differs
    # On 1 rank the 64x64 weights (2048-element shards on 2 ranks: fp32 there) are
    # quantised: their saved fp32 values are rounded to 8 bits once, and the log says so.
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "re-quantised with rounding" in log


@pytest.mark.slow
def test_a_two_rank_adamw_lowmem_run_resumes_bitwise(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    lowmem = ["optim=adamw_lowmem", *CKPT]
    assert launch(first, *lowmem).returncode == 0
    source = first / "checkpoints" / "step-00000006"
    done = launch(second, *lowmem, f"checkpoint.resume_from={source}")
    assert done.returncode == 0, done.stderr
    assert losses(second) == {s: losses(first)[s] for s in (7, 8)}
    assert losses(first)[8] < losses(first)[1] - 0.3
