"""Checkpoint benchmarks, one module each, run as `python -m toolkit.bench.checkpoint <name>`:

* `stall`: training stall per checkpoint (async vs blocking DCP save of the same state) and
  save throughput against the disk's raw write speed;
* `resume`: time from job start to the first resumed step as checkpoints grow;
* `cpu`: wall and CPU seconds per GB of each piece of a save;
* `gil`: how long an async save keeps the training thread from running Python;
* `writer`: whether a background write costs training through the GIL or the machine.

What they share (their job, a rank's trainer, the plain-write baseline, DCP's defaults put
back into the toolkit's save) is in `shared`; their ranks start through `toolkit.bench.ranks`.
`stall` times its trial windows in `windows`, with the baselines of `baselines`.
"""
