"""Liger's kernels, as shipped and as this model calls them, compile for a real GPU (sm_90:
H100/H200) down to a cubin, with no GPU here. The interpreter tests (test_liger*.py) run the
LayerNorm with two interpreter-only shims (toolkit.kernels.liger._patch_for_interpreter):
this is the check that the unpatched GPU path (libdevice rsqrt, eps.to(fp32)) builds with
the installed Triton. Shapes are gpt_125m's (dim 768, vocab 50304: the cross-entropy's block
of 32768 at 32 warps). In a subprocess, because triton.jit reads TRITON_INTERPRET when the
kernel modules are imported."""

from __future__ import annotations

import pytest

from tests.kernels.sm90 import compile_for_sm90
from toolkit.kernels.backend import importable

pytestmark = pytest.mark.load_tolerant  # asserts results, times nothing (scripts/test_suite.py)

COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from liger_kernel.ops import cross_entropy as ce, layer_norm as ln, utils as u

def build(kernel, types, constexprs, num_warps):
    sig = {n: types.get(n, "constexpr") for n in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    assert compiled.asm["cubin"], kernel
    return 1

n = 0
for dt in ("fp32", "bf16"):
    # LayerNorm at dim 768 (gpt_125m): BLOCK_SIZE 1024 and its warps (liger's calculate_settings)
    fwd = {k: f"*{dt}" for k in ("Y_ptr", "X_ptr", "W_ptr", "B_ptr")}
    fwd |= {"Mean_ptr": "*fp32", "RSTD_ptr": "*fp32", "eps": "fp32", "n_cols": "i32"}
    fwd |= {k: "i32" for k in ln._layer_norm_forward_kernel.arg_names if k.endswith("stride")}
    n += build(ln._layer_norm_forward_kernel, fwd, {"BLOCK_SIZE": 1024}, 4)
    bwd = {k: f"*{dt}" for k in ("X_ptr", "W_ptr", "DX_ptr", "DY_ptr")}
    bwd |= {"Mean_ptr": "*fp32", "RSTD_ptr": "*fp32", "DW_ptr": "*fp32", "DB_ptr": "*fp32"}
    bwd |= {k: "i32" for k in ln._layer_norm_backward_kernel.arg_names if k.startswith("stride")}
    bwd |= {"n_rows": "i32", "n_cols": "i32"}
    flags = {"rows_per_program": 63, "BLOCK_SIZE": 1024, "COMPUTE_DW": True, "COMPUTE_DB": True}
    n += build(ln._layer_norm_backward_kernel, bwd, flags, 4)
    # Cross-entropy over vocab 50304 as the fused linear + CE calls it (BLOCK_SIZE 32768, 32 warps)
    types = {"X_ptr": f"*{dt}", "Y_ptr": "*i64", "loss_ptr": "*fp32"}
    types |= {k: "i32" for k in ("X_stride", "Y_stride", "loss_stride", "n_cols", "n_non_ignore",
                                  "sum_non_ignore_weight", "ignore_index")}
    types |= {"weight_sum": "fp32"}
    consts = {k: None for k in ("weight_ptr", "z_loss_ptr", "token_accuracy_ptr",
                                "predicted_tokens_ptr", "softcap")}
    consts |= {"token_accuracy_stride": 0, "predicted_tokens_stride": 0, "lse_square_scale": 0.0,
               "label_smoothing": 0.0, "reduction": "mean", "RETURN_Z_LOSS": False,
               "RETURN_TOKEN_ACCURACY": False, "RETURN_PREDICTED_TOKENS": False,
               "BLOCK_SIZE": 32768, "HAS_WEIGHT": False, "HAS_SOFTCAPPING": False,
               "HAS_GRADIENTS": True}
    n += build(ce.liger_cross_entropy_kernel, types, consts, 32)
    mul = {"X_ptr": f"*{dt}", "X_stride": "i32", "grad_output_ptr": "*fp32", "n_cols": "i32"}
    n += build(u.element_mul_kernel, mul, {"BLOCK_SIZE": 1024, "X_col_stride": 1}, 32)
print("compiled", n)
"""


@pytest.mark.skipif(not importable("liger_kernel"), reason="liger-kernel is not installed")
@pytest.mark.slow
def test_liger_kernels_compile_to_sm90_cubins(tmp_path) -> None:
    stdout = compile_for_sm90(COMPILE, tmp_path)
    assert "compiled 8" in stdout  # 2 dtypes x (LayerNorm fwd, bwd, cross-entropy, scale)
