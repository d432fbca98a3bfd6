"""How the typed cluster config maps onto sbatch options (no cluster needed)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from toolkit.config.cluster import ClusterConfig, parse_sbatch_extra, slurm_problems
from toolkit.executors.slurm_jobs import failed_task
from toolkit.executors.slurm_sbatch import parameters, plan
from toolkit.slurm_records import JobState, _task_ids

REPO = Path("/repo")


def slurm(**fields) -> ClusterConfig:
    return ClusterConfig(kind="slurm", **fields)


def test_tasks_per_node_defaults_to_one_per_gpu_else_one():
    assert parameters(slurm(), REPO)["ntasks_per_node"] == 1
    assert parameters(slurm(gpus_per_node=4), REPO)["ntasks_per_node"] == 4
    assert parameters(slurm(gpus_per_node=4, tasks_per_node=2), REPO)["ntasks_per_node"] == 2


def test_requeue_is_requested_explicitly_either_way():
    assert parameters(slurm(), REPO)["additional_parameters"]["requeue"] is True
    assert parameters(slurm(requeue=False), REPO)["additional_parameters"]["no_requeue"] is True


def test_signal_and_lead_time_become_one_sbatch_option():
    script = plan(slurm(signal="USR1", signal_lead_s=300), [Path("/r")], REPO).script()
    assert "#SBATCH --signal=USR1@300" in script.splitlines()


def test_every_rank_is_started_under_one_srun_that_kills_on_bad_exit():
    script = plan(slurm(nodes=2), [Path("/r")], REPO).script()
    [srun] = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--kill-on-bad-exit=1" in srun
    assert srun.endswith("-u -m toolkit.entrypoint /r")


def test_unset_options_are_left_to_the_cluster():
    script = plan(slurm(), [Path("/r")], REPO).script()
    for option in ("--partition", "--account", "--qos", "--mem", "--gpus", "--wckey"):
        assert option not in script


def test_sbatch_extra_accepts_options_with_or_without_the_sbatch_prefix():
    assert parse_sbatch_extra(["--reservation=x", "#SBATCH --exclusive"]) == {
        "reservation": "x",
        "exclusive": True,
    }


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"time": "1 hour"}, "cluster.time=1 hour: not an sbatch time"),
        ({"mem": "lots"}, "cluster.mem=lots: not an sbatch memory size"),
        ({"sbatch_extra": ["reservation=x"]}, "cluster.sbatch_extra: 'reservation=x'"),
        ({"job_name": "a b"}, "cluster.job_name=a b: use letters"),
        ({"master_port": 80}, "cluster.master_port=80: must be in 1024..65535"),
    ],
)
def test_bad_sbatch_fields_are_named_with_their_value(fields, problem):
    [line] = slurm_problems(slurm(**fields))
    assert line.startswith(problem)


@pytest.mark.parametrize("time", ["30", "1:00:00", "2-00:00:00", "2-12", "10:30"])
def test_sbatch_time_forms_are_accepted(time):
    assert slurm_problems(slurm(time=time)) == []


def test_exit_status_is_zero_only_for_completed_jobs():
    assert JobState("COMPLETED", 0, 0).exit_status() == 0
    assert JobState("FAILED", 3, 0).exit_status() == 3
    assert JobState("CANCELLED", 0, 15).exit_status() == 143
    assert JobState("TIMEOUT", 0, 0).exit_status() == 1


def test_pending_array_records_expand_to_their_elements():
    assert _task_ids("0-3%2") == [0, 1, 2, 3]
    assert _task_ids("1,3") == [1, 3]


def test_the_first_failed_task_is_read_from_sruns_report():
    report = (
        "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Terminated\n"
    )
    assert failed_task(report) == 1
    assert failed_task("all good") is None


def test_a_job_that_can_never_start_is_not_waited_for(monkeypatch):
    from toolkit.executors import slurm

    pending = {"7": JobState("PENDING", 0, 0, reason="PartitionNodeLimit")}
    monkeypatch.setattr(slurm, "job_states", lambda job_id: pending)
    with pytest.raises(slurm.NeverRuns) as caught:
        slurm.wait("7")
    assert (caught.value.job_id, caught.value.reason) == ("7", "PartitionNodeLimit")


def test_a_job_waiting_for_resources_is_waited_for(monkeypatch):
    from toolkit.executors import slurm

    answers = iter(
        [
            {"7": JobState("PENDING", 0, 0, reason="Resources")},
            {"7": JobState("COMPLETED", 0, 0)},
        ]
    )
    monkeypatch.setattr(slurm, "job_states", lambda job_id: next(answers))
    monkeypatch.setattr(slurm, "POLL_S", 0)
    assert slurm.wait("7") == {"7": JobState("COMPLETED", 0, 0)}


def test_a_requeueable_job_is_followed_through_preemption():
    assert not JobState("PREEMPTED", 0, 0, requeue=True).final
    assert JobState("PREEMPTED", 0, 0, requeue=False).final
    assert JobState("FAILED", 1, 0, requeue=True).final


def test_a_followed_log_that_is_written_anew_after_a_requeue_is_followed_from_its_start(tmp_path):
    from toolkit.executors.slurm import _Tail

    log = tmp_path / "0_log.out"
    shown = io.StringIO()
    tail = _Tail(log, shown)
    tail.pump()  # not there yet: nothing, no error
    log.write_text("step 1\nstep 2\n")
    tail.pump()
    log.write_text("resumed at step 2\n")  # the requeued job truncates its log
    tail.pump()
    assert shown.getvalue() == "step 1\nstep 2\nresumed at step 2\n"


def test_following_a_job_says_when_it_was_requeued(monkeypatch, tmp_path, capsys):
    from toolkit.executors import slurm

    answers = iter(
        [
            {"7": JobState("RUNNING", 0, 0, requeue=True)},
            {"7": JobState("PENDING", 0, 0, reason="BeginTime", requeue=True, restarts=1)},
            {"7": JobState("RUNNING", 0, 0, requeue=True, restarts=1)},
            {"7": JobState("COMPLETED", 0, 0, requeue=True, restarts=1)},
        ]
    )
    monkeypatch.setattr(slurm, "job_states", lambda job_id: next(answers))
    monkeypatch.setattr(slurm, "POLL_S", 0)
    assert slurm.follow_job(tmp_path, "7", tmp_path / "run", follow=False) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "job 7 requeued (restart 1); following it until it ends",
        f"job 7 COMPLETED; run dir {tmp_path / 'run'}",
    ]
