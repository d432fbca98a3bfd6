"""Measuring the machine and checking the performance model against it: the hardware profile
(`python -m toolkit.measure.hardware`), the training run measured against its prediction
(`run`, with `results`, `stats`, `compare`), the model check over a grid (`model_check`) and the
planner's check (`plan_check`). Product code: toolkit.plan and toolkit.bench build on it."""
