#!/usr/bin/env bash
# GPU validation in one command (see toolkit/measure/gpu.py): NCCL, matmul peak, training
# throughput/MFU/memory of gpt_small and gpt_1b (eager and compiled), NVML telemetry.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m toolkit.measure.gpu "$@"
