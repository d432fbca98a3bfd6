"""NCCL / InfiniBand tuning: fabric detection, profiles, validation (docs/nccl.md).

`configure(cfg, env, run_dir)` runs in every rank before the process group exists;
`effective_env()` returns the NCCL_*/TORCH_NCCL_*/TORCH_FR_* variables in force.
"""

from toolkit.nccl.env import effective_env
from toolkit.nccl.setup import NcclSetupError, configure

__all__ = ["NcclSetupError", "configure", "effective_env"]
