"""With overlapped staging, save() returns before the state is copied; once the trainer has
called wait_staged() (right before the optimizer step) training may change the state, and
the checkpoint still holds the state of the step it was taken at."""

import torch
import torch.utils.serialization
from torch import nn

from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.checkpoint.manifest import verify
from toolkit.checkpoint.storage import LocalStorage
from toolkit.config.checkpoint import CheckpointConfig


def model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()  # the optimizer has state (exp_avg, exp_avg_sq) to save
    return model, optimizer


def test_state_changed_after_wait_staged_does_not_reach_the_checkpoint(single_rank_group, tmp_path):
    cfg = CheckpointConfig(enabled=True, overlap_staging=True)
    ckpt = Checkpointer(cfg, tmp_path, LocalStorage(), "{}", "cfg", torch.device("cpu"))
    model, optimizer = model_and_optimizer(seed=0)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}

    result = ckpt.save(1, model, optimizer, {"step": 1})
    assert result is not None and result.future is not None
    ckpt.wait_staged()  # what the trainer does before the optimizer step
    assert result.staged is None
    with torch.no_grad():  # training goes on while the save is written
        for p in model.parameters():
            p.add_(1.0)
    (done,) = ckpt.wait()
    assert done.error is None
    verify(done.path)

    fresh, fresh_optimizer = model_and_optimizer(seed=1)
    train_state, _ = ckpt.load(done.path, fresh, fresh_optimizer)
    assert train_state == {"step": 1}
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, at_save[name]), name
    ckpt.close()


def test_without_overlap_save_returns_with_the_state_already_copied(single_rank_group, tmp_path):
    cfg = CheckpointConfig(enabled=True, overlap_staging=False)
    ckpt = Checkpointer(cfg, tmp_path, LocalStorage(), "{}", "cfg", torch.device("cpu"))
    model, optimizer = model_and_optimizer(seed=0)
    result = ckpt.save(1, model, optimizer, {"step": 1})
    assert result is not None and result.staged is None
    assert ckpt.wait_staged() == 0.0
    (done,) = ckpt.wait()
    assert done.error is None and done.size_bytes > 0
    # The writer skipped torch.save's zip CRC only while it wrote: torch's setting is back.
    assert torch.utils.serialization.config.save.compute_crc32 is True
    ckpt.close()
