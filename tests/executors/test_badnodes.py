"""Evidence against nodes, read from the run dir (marks, hang summaries), and the record of
exclusions: real files, written as the ranks and the hang watchdog write them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from toolkit.executors import badnodes
from toolkit.executors.exclusion import BadNode, decide


def test_marks_are_kept_per_attempt_in_a_private_file(tmp_path):
    badnodes.mark(tmp_path, BadNode("n2", "straggler: 60% slower", 0, "straggler"))
    badnodes.mark(tmp_path, BadNode("n3", "hardware error: Xid", 1, "rank"))
    assert badnodes.marks(tmp_path, 0) == [BadNode("n2", "straggler: 60% slower", 0, "straggler")]
    assert [b.node for b in badnodes.marks(tmp_path, 1)] == ["n3"]
    assert stat.S_IMODE((tmp_path / badnodes.MARKS).stat().st_mode) == 0o600


def test_a_damaged_line_of_marks_is_skipped(tmp_path):
    (tmp_path / badnodes.MARKS).write_text('{"node": "n1"\nnot json\n')
    badnodes.mark(tmp_path, BadNode("n2", "x", 0, "rank"))
    assert [b.node for b in badnodes.marks(tmp_path, 0)] == ["n2"]


@pytest.mark.parametrize(
    ("text", "marked"),
    [
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", True),
        ("RuntimeError: injected ... (fault.fail_node)", True),
        ("torch.OutOfMemoryError: CUDA out of memory", False),
        ("RuntimeError: NCCL timeout in all_reduce", False),
        ("ZeroDivisionError: division by zero", False),
    ],
)
def test_only_hardware_errors_mark_the_ranks_node(tmp_path, monkeypatch, text, marked):
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    got = badnodes.note_rank_failure(tmp_path, f"Traceback ...\n{text}\n", attempt=3)
    assert (got is not None) == marked
    assert [(b.node, b.attempt, b.source) for b in badnodes.marks(tmp_path, 3)] == (
        [("n2", 3, "rank")] if marked else []
    )


def write_summary(run_dir: Path, when: str, stuck_hosts: list[str], **extra) -> Path:
    """A hang summary as the watchdog writes it (RUN_DIR/hangs/<UTC time>/summary.json)."""
    path = run_dir / "hangs" / when / "summary.json"
    path.parent.mkdir(parents=True)
    summary = {
        "stuck_ranks": [1],
        "stuck_hosts": stuck_hosts,
        "waiting_ranks": [0, 2, 3],
        "collective": {"op": "all_gather", "seq": 8812},
        "stuck_for_s": 612.0,
        "step": 20,
        "message": "hang: ranks 1 on node n2 stuck in all_gather #8812 for 612 s",
        "hosts_by_rank": ["n1", "n2", "n3", "n3"],
    } | extra
    path.write_text(json.dumps(summary))
    return path


def test_the_newest_hang_summary_naming_one_host_blames_it(tmp_path):
    write_summary(tmp_path, "20261201T010000Z", ["n3"])
    write_summary(tmp_path, "20261201T020000Z", ["n2"])
    (got,) = badnodes.hang_hosts(tmp_path, attempt=1)
    assert (got.node, got.attempt, got.source) == ("n2", 1, "hang")
    assert got.reason == "hang: ranks 1 stuck in all_gather #8812"


def test_a_hang_on_several_hosts_or_outside_a_collective_blames_no_node_or_the_one(tmp_path):
    write_summary(tmp_path, "20261201T020000Z", ["n2", "n3"])
    assert badnodes.hang_hosts(tmp_path, 0) == []
    write_summary(tmp_path, "20261201T030000Z", ["n3"], collective=None)
    assert [(b.node, b.reason) for b in badnodes.hang_hosts(tmp_path, 0)] == [
        ("n3", "hang: ranks 1 stuck")
    ]


def test_a_hang_summary_older_than_the_attempt_is_not_its_evidence(tmp_path):
    path = write_summary(tmp_path, "20261201T020000Z", ["n2"])
    os.utime(path, (1000.0, 1000.0))
    assert badnodes.hang_hosts(tmp_path, 1, since=2000.0) == []
    assert badnodes.hang_hosts(tmp_path, 1, since=500.0) != []


def test_excluded_nodes_json_records_node_reason_attempt_time_and_is_private(tmp_path):
    first = decide([BadNode("n2", "NODE_FAIL", 0, "slurm")], [], ["n1", "n2", "n3"], 2)
    badnodes.record(tmp_path, first, "17")
    second = decide([BadNode("n3", "XID 79", 1, "telemetry")], ["n2"], ["n1", "n3", "n4"], 2)
    badnodes.record(tmp_path, second, "17")
    path = tmp_path / "excluded_nodes.json"
    doc = json.loads(path.read_text())
    assert doc["job_id"] == "17" and doc["exclude"] == ["n2", "n3"]
    assert [(e["node"], e["reason"], e["attempt"], e["source"]) for e in doc["nodes"]] == [
        ("n2", "NODE_FAIL", 0, "slurm"),
        ("n3", "XID 79", 1, "telemetry"),
    ]
    assert all(e["time"] > 0 and e["time_utc"].endswith("Z") for e in doc["nodes"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert badnodes.excluded(tmp_path) == doc["nodes"]


def telemetry_run(run_dir: Path) -> list[Path]:
    """Two nodes' telemetry files of attempt 0, written by the real writer."""
    from toolkit.telemetry.synthetic import Plan, generate

    plan = Plan(nodes=2, gpus_per_node=1, duration_s=20, straggler_rank=None,
                idle_gap_at_s=None, checkpoint_every_s=1e9, ib_ports=0)  # fmt: skip
    return generate(run_dir, plan).files


def test_telemetry_of_the_attempt_names_a_node_with_new_uncorrectable_ecc_errors(tmp_path):
    import h5py

    files = telemetry_run(tmp_path)
    assert badnodes.telemetry_nodes(tmp_path, 0) == []
    with h5py.File(files[1], "r+") as f:  # the counter rises on gpu-node001's GPU
        column = f["gpu/0/ecc_uncorrected_volatile"]
        column[len(column) // 2 :] = 2
    (got,) = badnodes.telemetry_nodes(tmp_path, 0)
    assert (got.node, got.reason, got.source) == (
        "gpu-node001",
        "uncorrectable ECC errors on GPU 0",
        "telemetry",
    )
    assert badnodes.telemetry_nodes(tmp_path, 1) == []  # another attempt's files only


def test_telemetry_of_the_attempt_names_a_node_with_an_xid_event(tmp_path):
    import h5py

    files = telemetry_run(tmp_path)
    with h5py.File(files[0], "r+") as f:
        events = f["events"]
        for name, value in [("start", 1.0), ("end", 1.0), ("step", -1), ("rank", -1),
                            ("name", b"xid"), ("attrs", b'{"gpu": 0, "xid": 79}')]:  # fmt: skip
            column = events[name]
            column.resize((len(column) + 1,))
            column[-1] = value
    (got,) = badnodes.telemetry_nodes(tmp_path, 0)
    assert (got.node, got.reason) == ("gpu-node000", "XID 79")
