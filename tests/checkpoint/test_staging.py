"""The async save's copy into CPU memory: exact, reusing its buffers, and without holding the
GIL, so that the training thread keeps running while the state is copied."""

import sys
import time

import pytest
import torch

from toolkit.bench.checkpoint import kept_out_while
from toolkit.checkpoint.staging import build_stager


def state_dict():
    flat = torch.arange(12, dtype=torch.float32)
    return {
        "model": {"w": torch.randn(4, 5), "a": flat[:6].view(2, 3), "b": flat[6:]},  # one storage
        "optim": {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.ones(4, 5)}}},
        "lr": 0.1,
    }


def test_staged_copy_is_exact_and_reuses_its_buffers():
    stager = build_stager(torch.device("cpu"), overlap=True)
    try:
        source = state_dict()
        staged = stager.stage(source).result()
        assert torch.equal(staged["model"]["w"], source["model"]["w"])
        assert torch.equal(staged["model"]["b"], torch.arange(6, 12, dtype=torch.float32))
        assert staged["optim"]["state"]["w"]["step"].item() == 3.0 and staged["lr"] == 0.1
        assert staged["model"]["w"].data_ptr() != source["model"]["w"].data_ptr()
        # views of one storage stay views of one staged storage
        a, b = staged["model"]["a"], staged["model"]["b"]
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

        source["model"]["w"].add_(1.0)  # training changes the state; the next save copies again
        again = stager.stage(source).result()
        assert torch.equal(again["model"]["w"], source["model"]["w"])
        assert again["model"]["w"].data_ptr() == staged["model"]["w"].data_ptr()  # reused
    finally:
        stager.close()


def share_kept_out(stager, source) -> float:
    """The share of the staging time during which the calling thread (the training thread)
    wanted to run Python and could not. The switch interval is raised so that the GIL
    changes hands only when a thread gives it up: a copy that holds the GIL keeps the
    training thread out for the whole copy."""
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(1.0)
    torch.set_num_threads(1)  # one core copies, one runs this thread: no wait for a core
    try:
        t0 = time.perf_counter()
        future = stager.stage(source)
        kept_out = kept_out_while(lambda: not future.done(), tick_s=0.0005, slack_s=0.0005)
        future.result()
        return kept_out / (time.perf_counter() - t0)
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(threads)


def test_staging_leaves_the_gil_to_the_training_thread():
    source = {f"t{i}": torch.randn(16_000_000) for i in range(6)}  # 6 x 64 MB
    ours = build_stager(torch.device("cpu"), overlap=True)
    dcp = build_stager(torch.device("cpu"), overlap=True, gil_free=False)  # DCP's, the control
    try:
        for stager in (ours, dcp):
            stager.stage(source).result()  # first save: buffers allocated
        shares = {"ours": [], "dcp": []}
        for _ in range(5):
            shares["ours"].append(share_kept_out(ours, source))
            shares["dcp"].append(share_kept_out(dcp, source))
    finally:
        ours.close()
        dcp.close()
    # DCP's storage copies hold the GIL: the training thread waits out every copy (measured
    # here: 0.4-0.9 of the staging time); ours releases it while copying (0.0-0.45, what is
    # left being the walk over the state dict and the machine's noise). Noise only ever adds
    # time kept out, so each stager is judged by its best of five: a copy that holds the GIL
    # can never do well, one that releases it does whenever the machine lets it.
    ours_best, dcp_best = min(shares["ours"]), min(shares["dcp"])
    assert dcp_best > 0.4, shares
    assert ours_best < dcp_best / 2, shares


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned staging needs CUDA")
def test_staging_from_gpu_is_pinned():
    stager = build_stager(torch.device("cuda"), overlap=True)
    try:
        staged = stager.stage({"w": torch.randn(1024, device="cuda")}).result()
        assert staged["w"].device.type == "cpu" and staged["w"].is_pinned()
    finally:
        stager.close()
