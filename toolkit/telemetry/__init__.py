"""Per-node telemetry: a node agent samples GPUs (NVML), the host (psutil) and InfiniBand
ports (sysfs) and receives every local rank's step records and events, all written into one
HDF5 file per node and job attempt; post-run `report` and live `watch` read those files.

Layout and design: docs/telemetry.md."""
