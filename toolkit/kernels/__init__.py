"""Fused and low-memory kernels: adopted ones (Liger) and our own Triton kernels, each with a
PyTorch reference beside it. `backend` says where Triton can run (a CUDA GPU, or the CPU
under TRITON_INTERPRET=1, which is how CI checks every kernel for correctness)."""
