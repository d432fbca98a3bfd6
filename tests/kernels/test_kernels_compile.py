"""The Triton kernels compile for a real GPU (sm_90: H100/H200) down to a cubin, with no GPU
here: the interpreter (which the other kernel tests use) accepts code that the compiler may
reject, so this is the check that the GPU path builds. In a subprocess, because triton.jit
reads TRITON_INTERPRET when the kernel modules are imported."""

from __future__ import annotations

import textwrap

import pytest

from tests.kernels.sm90 import compile_for_sm90
from toolkit.kernels.backend import importable

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

COMPILE = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from toolkit.kernels import masked_loss as ml, masked_norm as mn

    def norm_sig(dt, names):
        return {n: ("*u8" if n == "M" else "*fp32" if n in ("MEAN", "RSTD") else f"*{dt}")
                for n in names} | {"N": "i32", "F": "i32"}

    def loss_sig(dt):
        return {"P": f"*{dt}", "T": "*fp32", "W": "*fp32", "numel": "i32", "N": "i32",
                "delta": "fp32"}

    jobs = []
    for dt in ("fp32", "bf16"):
        blocks = {"BLOCK_N": 512, "BLOCK_F": 8}
        fwd = norm_sig(dt, ("X", "M", "Y", "MEAN", "RSTD")) | {"eps": "fp32"}
        bwd = norm_sig(dt, ("DY", "X", "M", "MEAN", "RSTD", "DX"))
        jobs += [(mn._norm_fwd, fwd, blocks), (mn._norm_bwd, bwd, blocks)]
        for huber in (False, True):
            flags = {"HUBER": huber, "HAS_WEIGHT": not huber, "BLOCK": 1024}
            fwd = loss_sig(dt) | {"PARTIAL": "*fp32"}
            bwd = loss_sig(dt) | {"GO": "*fp32", "DP": f"*{dt}", "inv_numel": "fp32"}
            jobs += [(ml._loss_fwd, fwd, flags), (ml._loss_bwd, bwd, flags)]
    for kernel, sig, constexprs in jobs:
        names = kernel.arg_names
        sig = {n: sig.get(n, "constexpr") for n in names}
        src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], kernel
    print("compiled", len(jobs))
    """
)


@pytest.mark.skipif(not importable("triton"), reason="triton is not installed")
@pytest.mark.slow
def test_kernels_compile_to_sm90_cubins(tmp_path) -> None:
    stdout = compile_for_sm90(COMPILE, tmp_path)
    assert "compiled 12" in stdout
