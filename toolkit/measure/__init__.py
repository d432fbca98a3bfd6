"""Measuring the machine and checking the performance model against it: the hardware profile
(`python -m toolkit.measure.hardware`), the training run measured against its prediction
(`run`, with `results`, `stats`, `compare`), the model check over a grid (`model_check`), the
planner's check (`plan_check`) and the GPU validation (`gpu`, with its planner step
`gpu_plans`). Product code on top of toolkit.perfmodel.planner (the ranking it checks), below
the planner's command line (toolkit.plan, whose --check runs plan_check); toolkit.bench
builds on it."""
