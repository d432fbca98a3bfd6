"""One configuration of the quant benchmark: a model (or an ensemble of K) trained for a
time budget on the book's windows, with the step's split, samples/s, time to a target
validation loss and, on a GPU, its utilisation.

A step is data (the batch's windows gathered and moved to the device), forward and backward,
and the optimizer. Eagerly each phase is timed: CUDA events recorded at the boundaries on a
GPU (read once at the end: no host sync inside the loop), wall time on a CPU. The data wait
is the host's time to produce the batch. With `graphed` (CUDA only) the whole step, forward,
backward and a capturable optimizer, is one CUDA graph replayed each step (torch.cuda.graphs'
whole-network capture); its split is the batch's copy into the graph's inputs and the replay.

An ensemble is the toolkit's (toolkit.train.ensemble.Stack): the members' parameters
stacked, their losses by torch.func.vmap over functional_call, one AdamW over the stacked
tensors (every member here has the same learning rate, so that is each member's AdamW).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from toolkit.bench.quant_data import Windows
from toolkit.train.ensemble import Stack
from toolkit.train.optim import step_kernels

Batch = tuple[torch.Tensor, torch.Tensor]


def mse(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return (model(x) - y).square().mean()


@dataclass
class Trainee:
    """What one configuration trains: the parameters' owner, the losses of a batch ([K], or
    [1] for one model), and the optimizer."""

    module: nn.Module
    losses: Callable[[Batch], torch.Tensor]
    optimizer: torch.optim.Optimizer
    members: int


def trainee(
    build: Callable[[], nn.Module],
    members: int,
    device: torch.device,
    lr: float,
    fused: str,
    capturable: bool = False,
) -> Trainee:
    """One model (members 0) or an ensemble of `members`, each built after
    torch.manual_seed(its index), on `device`, with AdamW's kernels as optim.fused would pick
    them (toolkit.train.optim.step_kernels)."""
    models = []
    for i in range(max(1, members)):
        torch.manual_seed(i)
        models.append(build())
    if members:
        stack = Stack(models, mse)
        stack.model.to(device)
        module, losses = stack.model, stack.member_losses
    else:
        module = models[0].to(device)

        def losses(batch: Batch) -> torch.Tensor:
            return mse(module, batch)[None]

    kernels = step_kernels(torch.optim.AdamW, fused, device)
    if capturable:  # a graph's optimizer keeps its step count on the device
        kernels = {"fused": True, "capturable": True}
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0, **kernels)
    return Trainee(module, losses, optimizer, max(1, members))


class Clock:
    """Marks at a step's phase boundaries: CUDA events on a GPU (resolved once, at the end),
    perf_counter on a CPU. `spans()` gives each phase's seconds, summed over the steps."""

    def __init__(self, device: torch.device, phases: tuple[str, ...]):
        self.cuda = device.type == "cuda"
        self.phases = phases
        self.marks: list[list[Any]] = []

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def step(self, marks: list[Any]) -> None:
        self.marks.append(marks)

    def spans(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = dict.fromkeys(self.phases, 0.0)
        for marks in self.marks:
            for name, a, b in zip(self.phases, marks, marks[1:], strict=False):
                out[name] += a.elapsed_time(b) / 1000 if self.cuda else b - a
        return out


class Utilisation:
    """GPU utilisation (NVML's, %) sampled every `interval_s` on a thread while the steps
    run; `mean()` is None with the reason kept in `why` where NVML is absent."""

    def __init__(self, device: torch.device, nvml: Any = None, interval_s: float = 0.05):
        self.samples: list[float] = []
        self.why: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if device.type != "cuda":
            self.why = "not a GPU"
            return
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self._nvml = nvml
            self._handle = nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception as exc:  # noqa: BLE001 - no driver or library: reported, not fatal
            self.why = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            self.samples.append(float(rates.gpu))

    def __enter__(self) -> Utilisation:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._nvml.nvmlShutdown()  # NVML counts its inits: one shutdown for ours

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


@dataclass
class Budget:
    seconds: float  # training time (evaluations excluded), after the warm-up steps
    warmup_steps: int
    max_steps: int
    eval_every: int  # steps between validations, or
    eval_every_s: float  # seconds (host time: on a GPU the queue may run ahead of it)
    target_loss: float


@dataclass
class Outcome:
    steps: int = 0
    train_s: float = 0.0
    data_wait_s: float = 0.0
    split_s: dict[str, float] = field(default_factory=dict)
    val_curve: list[tuple[float, float]] = field(default_factory=list)  # (train s, loss)
    time_to_target_s: float | None = None
    gpu_util_pct: float | None = None
    gpu_util_why: str | None = None
    notes: list[str] = field(default_factory=list)


def validation_loss(t: Trainee, windows: Windows, chunk: int = 1024) -> float:
    """The members' median validation loss (the model's, for one), over the validation
    windows `chunk` at a time (an ensemble's activations for all of them at once could be
    many GB on a GPU)."""
    t.module.eval()
    total = torch.zeros(t.members, device=windows.val_ends.device)
    with torch.no_grad():
        for ends in windows.val_ends.split(chunk):
            total += t.losses(windows.batch(ends)).float() * ends.numel()
    t.module.train()
    return float((total / windows.val_ends.numel()).median())


def sampler(windows: Windows, batch: int, seed: int) -> Callable[[], Batch]:
    """Each call: a batch of training windows drawn with replacement by a seeded generator
    (on the windows' device: the draw and the gather stay there)."""
    device = windows.train_ends.device
    g = torch.Generator(device=device).manual_seed(seed)
    n = windows.train_ends.numel()

    def draw() -> Batch:
        idx = torch.randint(0, n, (batch,), generator=g, device=device)
        return windows.batch(windows.train_ends[idx])

    return draw


def run_eager(
    t: Trainee, draw: Callable[[], Batch], windows: Windows, budget: Budget, device: torch.device
) -> Outcome:
    clock = Clock(device, ("data", "forward_backward", "optimizer"))
    return _loop(t, draw, windows, budget, device, clock, _eager_step(t, clock))


def _eager_step(t: Trainee, clock: Clock) -> Callable[[Callable[[], Batch], bool], float]:
    def step(draw: Callable[[], Batch], timed: bool) -> float:
        m0 = clock.mark()
        host0 = time.perf_counter()
        batch = draw()
        waited = time.perf_counter() - host0
        m1 = clock.mark()
        t.losses(batch).sum().backward()
        m2 = clock.mark()
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
        m3 = clock.mark()
        if timed:
            clock.step([m0, m1, m2, m3])
        return waited

    return step


def run_graphed(
    t: Trainee, draw: Callable[[], Batch], windows: Windows, budget: Budget, device: torch.device
) -> Outcome:
    """The whole step captured once as a CUDA graph, then replayed (CUDA only)."""
    static_x, static_y = (b.clone() for b in draw())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
        for _ in range(3):
            t.optimizer.zero_grad(set_to_none=True)
            t.losses((static_x, static_y)).sum().backward()
            t.optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    t.optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        t.losses((static_x, static_y)).sum().backward()
        t.optimizer.step()
    clock = Clock(device, ("data", "graph_replay"))

    def step(draw_: Callable[[], Batch], timed: bool) -> float:
        m0 = clock.mark()
        host0 = time.perf_counter()
        x, y = draw_()
        static_x.copy_(x)
        static_y.copy_(y)
        waited = time.perf_counter() - host0
        m1 = clock.mark()
        graph.replay()
        m2 = clock.mark()
        if timed:
            clock.step([m0, m1, m2])
        return waited

    return _loop(t, draw, windows, budget, device, clock, step)


def _loop(
    t: Trainee,
    draw: Callable[[], Batch],
    windows: Windows,
    budget: Budget,
    device: torch.device,
    clock: Clock,
    step: Callable[..., float],
) -> Outcome:
    """Warm-up steps, then timed steps with a validation every eval_every steps (or
    eval_every_s) until the budget's training seconds are spent. Warnings torch raises on
    the way (e.g. an op vmap runs by a slow fallback) become the outcome's notes."""
    out = Outcome()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    utilisation = Utilisation(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(budget.warmup_steps):  # compile, autotune, first allocations
            step(draw, False)
        sync()
        with utilisation:
            while out.steps < budget.max_steps and out.train_s < budget.seconds:
                started = time.perf_counter()
                for _ in range(budget.eval_every):
                    out.data_wait_s += step(draw, True)
                    out.steps += 1
                    if time.perf_counter() - started > budget.eval_every_s:
                        break
                sync()
                out.train_s += time.perf_counter() - started
                loss = validation_loss(t, windows)
                out.val_curve.append((out.train_s, loss))
                if out.time_to_target_s is None and loss <= budget.target_loss:
                    out.time_to_target_s = out.train_s
    out.notes = sorted({str(w.message).split(".")[0] for w in caught})
    out.split_s = clock.spans()
    out.gpu_util_pct, out.gpu_util_why = utilisation.mean(), utilisation.why
    return out
