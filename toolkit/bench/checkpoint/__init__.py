"""Checkpoint benchmarks, one module each, run as `python -m toolkit.bench.checkpoint <name>`:

* `stall`: training stall per checkpoint (async vs blocking DCP save of the same state) and
  save throughput against the disk's raw write speed;
* `resume`: time from job start to the first resumed step as checkpoints grow.

(`cpu`, `gil` and `writer`, one-off investigations, were removed in the benchmark
reorganisation; their figures and the commits that produced them are in docs/BENCHMARKS.md.)

What they share (their job, a rank's trainer, the plain-write baseline, DCP's defaults put
back into the toolkit's save) is in `shared`; their ranks start through `toolkit.bench.ranks`.
`stall` times its trial windows in `windows`, with the baselines of `baselines`.
"""
