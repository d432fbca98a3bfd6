"""The `toolkit` command: one subcommand per existing entry point (launch, report, watch,
bench, perfmodel, export, cluster) and the run-directory views (status, runs). A top-level
unit: it may import anything; nothing of the toolkit imports it."""
