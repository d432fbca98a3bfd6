"""One requeue policy, built from the job's config, says when a job is requeued and what it
may leave out; every path that requeues asks it (no Slurm needed)."""

from __future__ import annotations

from toolkit.config.compose import compose_raw, to_job
from toolkit.executors.requeue import JobShape, RequeuePolicy


def test_the_policy_is_the_config_of_requeue_restarts_and_exclusion():
    job = to_job(
        compose_raw(
            [
                "cluster=slurm",
                "cluster.nodes=2",
                "cluster.exclude=n9",
                "checkpoint.max_restarts=4",
                "fault.exclude_nodes=false",
            ]
        )
    )
    policy = RequeuePolicy.of(job)
    assert policy == RequeuePolicy(True, 4, JobShape(2, "n9", job.cluster.partition, False))


def test_a_restart_is_one_requeue_counted_by_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert RequeuePolicy.restarts() == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert RequeuePolicy.restarts() == 2


def test_the_cap_and_the_switch_refuse_a_requeue_in_words():
    policy = RequeuePolicy(requeue=True, max_restarts=2)
    assert policy.allows(1) and policy.refusal("12", 1) is None
    assert not policy.allows(2) and policy.exhausted(2)
    assert policy.refusal("12", 2) == (
        "job 12 restarted 2 times (checkpoint.max_restarts=2): not requeueing"
    )
    off = RequeuePolicy(requeue=False, max_restarts=2)
    assert not off.allows(0) and not off.exhausted(0)
    assert off.refusal("12", 0) == "checkpoint.requeue=false: not requeueing job 12"
