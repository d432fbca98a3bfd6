"""Post-run analysis of a run's node files: `python -m toolkit.telemetry report RUN_DIR`."""
