"""How the Slurm adapter reads Slurm's answers, on answers recorded from the dev cluster
(Slurm 22.05; tests/executors/data/, captured with the commands named in each test), and how
its one wrapper fails: one line when a command is missing or does not answer."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from toolkit import slurm_cli, slurm_records
from toolkit.distributed.env import expand_nodelist
from toolkit.executors.slurm_exclude import is_down, usable

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_an_array_with_pending_elements_reads_as_one_state_per_element():
    # scontrol show job -o 83, for `sbatch --array=0-3%2`: two elements run, two wait in one
    # shared record ("ArrayTaskId=2-3%2").
    records = slurm_records.parse_show_job(recorded("scontrol_show_job_array.txt"))
    assert [(r.job_id, r.array_task_id, r.state) for r in records] == [
        ("83", "2-3%2", "PENDING"),
        ("87", "1", "RUNNING"),
        ("86", "0", "RUNNING"),
    ]
    states = slurm_records.states_of(records)
    assert sorted(states) == ["83_0", "83_1", "83_2", "83_3"]
    assert states["83_2"].reason == "JobArrayTaskLimit" and not states["83_2"].final
    assert states["83_0"].state == "RUNNING" and states["83_0"].requeue


def test_a_requeued_job_shows_its_restart_count_exclude_list_and_log():
    # scontrol show job -o 84 after `scontrol requeue 84` and
    # `scontrol update JobId=84 StartTime=now ExcNodeList=n3`.
    (job,) = slurm_records.parse_show_job(recorded("scontrol_show_job_requeued.txt"))
    assert (job.job_id, job.state, job.restarts, job.requeue) == ("84", "RUNNING", 1, True)
    assert (job.exc_node_list, job.partition, job.std_out) == ("n3", "debug", "/tmp/req_84.out")
    assert job.end_time == slurm_records.parse_time("2027-12-03T11:16:32")
    assert slurm_records.states_of([job]) == {
        "84": slurm_records.JobState("RUNNING", 0, 0, "None", True, 1)
    }


def test_accounting_names_every_attempt_of_a_requeued_job():
    # sacct -n -D -X -P -j 84 -o State,NodeList,Start,End
    first, second = slurm_records.parse_attempts(recorded("sacct_attempts_requeued.txt"))
    assert (first.state, first.nodelist, first.ended) == ("REQUEUED", "n1", True)
    assert (second.state, second.end, second.ended) == ("RUNNING", "Unknown", False)
    assert slurm_records.parse_time(second.end) is None


def test_accounting_states_carry_exit_codes_once_slurmctld_forgot_the_job():
    # sacct -n -X -P -j 85 -o JobID,State,ExitCode, for `sbatch --wrap "exit 3"`
    failed = slurm_records.parse_sacct_states(recorded("sacct_states_failed.txt"))
    assert failed == {"85": slurm_records.JobState("FAILED", 3, 0)}
    assert failed["85"].final and failed["85"].exit_status() == 3
    # the same for the array, element by element
    states = slurm_records.parse_sacct_states(recorded("sacct_states_array.txt"))
    assert {k: s.exit_status() for k, s in states.items()} == {f"83_{i}": 0 for i in range(4)}


def test_the_report_reads_accounting_as_json_or_in_the_parsable_form():
    # sacct -j 85 --json, and sacct -j 85 -X -P -n -o <PARSABLE_FIELDS>
    (as_json,) = slurm_records.parse_sacct_json(recorded("sacct_json_failed.json"))
    (parsable,) = slurm_records.parse_sacct_parsable(recorded("sacct_parsable_failed.txt"))
    for summary in (as_json, parsable):
        assert (str(summary["job_id"]), summary["state"], summary["nodes"]) == (
            "85",
            "FAILED",
            "n1",
        )
        assert summary["name"] == "wrap" and summary["elapsed_s"] == 0
    assert slurm_records.parse_sacct_json("sacct: error: no JSON plugin") is None


def test_node_states_and_node_events_of_the_dev_cluster():
    # sinfo -h -N -o '%N %t'
    nodes = slurm_records.parse_sinfo_nodes(recorded("sinfo_nodes.txt"))
    assert nodes == {"n1": "idle", "n2": "idle", "n3": "idle"}
    assert all(usable(s) and not is_down(s) for s in nodes.values())
    # sacctmgr -n -P show event Nodes=n1,n2,n3 Start=... format=NodeName,State,Reason,TimeStart,
    # after the node-exclusion tests set n2 DOWN
    events = slurm_records.parse_node_events(recorded("sacctmgr_events.txt"))
    assert {(e.node, e.state) for e in events} == {("n2", "DOWN")}
    assert {e.reason for e in events} == {"toolkit-test", "detached"}
    assert all(slurm_records.parse_time(e.start) is not None for e in events)


def test_without_scontrol_a_nodelist_expands_as_scontrol_expands_it(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert slurm_cli.hostnames("n[1-3]") is None  # the caller parses it itself, then
    # scontrol show hostnames 'n[1-3]'
    assert expand_nodelist("n[1-3]") == recorded("scontrol_show_hostnames.txt").split()


def test_a_missing_silent_or_failing_command_is_one_line(monkeypatch):
    with pytest.raises(slurm_cli.SlurmCommandError, match=r"^sleep 5: no answer within 0.2 s$"):
        slurm_cli.run("sleep", "5", timeout_s=0.2)
    with pytest.raises(slurm_cli.SlurmCommandError) as failed:
        slurm_cli.run(
            "sh", "-c", "echo 'error: Invalid job id' >&2; echo more >&2; exit 1", check=True
        )
    assert (
        str(failed.value)
        == "sh -c echo 'error: Invalid job id' >&2; echo more >&2; exit 1: error: Invalid job id"
    )
    monkeypatch.setenv("PATH", "")
    with pytest.raises(slurm_cli.SlurmCommandError, match=r"^scontrol: not found on PATH$"):
        slurm_cli.requeue_job("7")
    # the queries that may go unanswered say so with an empty answer, not an exception
    assert slurm_cli.node_states() == {} and slurm_cli.attempts("7") == []
    assert slurm_cli.node_events(["n1"], "2026-01-01T00:00:00") == []
    assert slurm_cli.state_word("7") is None and slurm_cli.end_time("7") is None


def test_a_command_that_ends_its_own_job_outlives_the_sigterm_of_that_end():
    # `scontrol requeue` of the job it runs in: Slurm's SIGTERM to every process of the job
    # reaches that scontrol too; run this way it still reads and reports the answer.
    kills_itself = ("sh", "-c", "kill -TERM $$; echo answered")
    assert slurm_cli.run(*kills_itself).returncode == -signal.SIGTERM
    outlived = slurm_cli.run(*kills_itself, outlive_term=True)
    assert (outlived.returncode, outlived.stdout) == (0, "answered\n")
