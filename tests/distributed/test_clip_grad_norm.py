"""clip_grad_norm_ over gradients that live on different meshes (a 1-D dp mesh, a 2-D
(dp, tp) mesh, none): the norm and the clipped gradients equal those of the same plain
tensors, where one DTensor op across meshes would raise."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from toolkit.distributed.fsdp import clip_grad_norm_


def model_with_grads(mesh_1d, mesh_2d) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    plain = [torch.randn(8, 4), torch.randn(6), torch.randn(4, 4)]
    grads = [torch.randn_like(p) * 3 for p in plain]
    model = nn.Module()
    placed = [
        distribute_tensor(plain[0], mesh_2d, [Shard(0), Shard(0)]),
        distribute_tensor(plain[1], mesh_1d, [Replicate()]),
        plain[2],
    ]
    placed_grads = [  # copies: a 1-rank shard may share the tensor's storage
        distribute_tensor(grads[0].clone(), mesh_2d, [Shard(0), Shard(0)]),
        distribute_tensor(grads[1].clone(), mesh_1d, [Replicate()]),
        grads[2].clone(),
    ]
    for i, (p, g) in enumerate(zip(placed, placed_grads, strict=True)):
        param = nn.Parameter(p)
        param.grad = g
        model.register_parameter(f"p{i}", param)
    return model, grads


@pytest.mark.usefixtures("single_rank_group")
def test_the_norm_over_several_meshes_is_the_norm_of_the_plain_gradients() -> None:
    mesh_2d = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"))
    mesh_1d = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    model, grads = model_with_grads(mesh_1d, mesh_2d)
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    with pytest.raises(Exception, match="DTensor|mesh"):  # one foreach norm over all of them
        torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], foreach=True)

    total = clip_grad_norm_(model, max_norm=1.0)
    assert float(total) == pytest.approx(float(expected), rel=1e-6)
    clipped = [
        p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        for p in model.parameters()
    ]
    scale = 1.0 / (float(expected) + 1e-6)
    for got, g in zip(clipped, grads, strict=True):
        torch.testing.assert_close(got, g * scale, rtol=1e-5, atol=1e-7)
    after = torch.linalg.vector_norm(torch.cat([g.flatten() for g in clipped]))
    assert float(after) == pytest.approx(1.0, rel=1e-5)
