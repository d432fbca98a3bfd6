"""The exclusion decision: which nodes a requeued job leaves out, and when it must stop
instead (a pure function: no Slurm)."""

from __future__ import annotations

from toolkit.executors.exclusion import BadNode, decide, hostnames

NODES = ["n1", "n2", "n3", "n4"]


def bad(node: str, reason: str = "NODE_FAIL", attempt: int = 0) -> BadNode:
    return BadNode(node, reason, attempt, "slurm")


def test_a_bad_node_is_added_to_the_exclude_list_with_its_reason():
    d = decide([bad("n2")], [], NODES, job_nodes=2)
    assert d.schedulable and d.exclude == ["n2"]
    assert [(b.node, b.reason) for b in d.added] == [("n2", "NODE_FAIL")]
    assert d.message == "excluding n2 (NODE_FAIL); exclude list n2"


def test_the_exclude_list_merges_with_the_jobs_and_the_configs_and_keeps_them():
    # ExcNodeList n4 and cluster.exclude n1 stay; n3 is new; duplicates count once.
    d = decide([bad("n3"), bad("n3", "XID 79")], ["n4", "n1", "n4"], NODES + ["n5"], 2)
    assert d.exclude == ["n1", "n3", "n4"]
    assert [b.reason for b in d.added] == ["NODE_FAIL"]  # the first reason for a node


def test_a_node_already_excluded_is_not_added_again():
    d = decide([bad("n2")], ["n2"], NODES, 2)
    assert d.schedulable and d.exclude == ["n2"] and d.added == []
    assert d.message == "no bad node to exclude"


def test_no_evidence_changes_nothing():
    d = decide([], ["n4"], NODES, 2)
    assert (d.exclude, d.added, d.schedulable) == (["n4"], [], True)


def test_exclusion_never_leaves_fewer_usable_nodes_than_the_job_needs():
    # n3 excluded by the config, n4 down (not usable): excluding n2 would leave n1 alone.
    d = decide([bad("n2")], ["n3"], ["n1", "n2", "n3"], job_nodes=2)
    assert not d.schedulable
    assert d.exclude == ["n3"] and d.added == []  # the list is left as it was
    assert [b.node for b in d.ignored] == ["n2"]
    assert d.message == (
        "excluding n2 (NODE_FAIL) would leave 1 usable node(s) (n1) for a 2-node job; "
        "not requeueing: it could never be scheduled"
    )


def test_exactly_enough_nodes_left_is_schedulable():
    d = decide([bad("n2")], [], ["n1", "n2", "n3"], job_nodes=2)
    assert d.schedulable and d.exclude == ["n2"]


def test_a_down_node_counts_as_unusable_whether_excluded_or_not():
    # The bad node is down (not in `usable`): excluding it costs no usable node.
    d = decide([bad("n2")], [], ["n1", "n3"], job_nodes=2)
    assert d.schedulable and d.exclude == ["n2"]


def test_exclude_nodes_false_keeps_the_list_and_says_what_it_did_not_exclude():
    d = decide([bad("n2", "hang: ranks 1 stuck")], ["n4"], NODES, 2, enabled=False)
    assert d.schedulable and d.exclude == ["n4"] and d.added == []
    assert d.message == "fault.exclude_nodes=false: not excluding n2 (hang: ranks 1 stuck)"


def test_several_bad_nodes_at_once_are_named_in_one_line():
    d = decide([bad("n3", "XID 79"), bad("n1", "hardware error: uncorrectable ECC")], [], NODES, 2)
    assert d.exclude == ["n1", "n3"]
    assert d.message.startswith("excluding n1 (hardware error: uncorrectable ECC), n3 (XID 79)")


def test_hostnames_reads_slurm_host_lists():
    assert hostnames("n[1-3],gpu7") == ["n1", "n2", "n3", "gpu7"]
    assert hostnames("(null)") == hostnames(None) == hostnames("") == []


def test_an_unknown_partition_state_does_not_stop_the_requeue():
    # sinfo did not answer: the bad node is still left out, the count is not held against it.
    d = decide([bad("n2")], ["n3"], None, job_nodes=2)
    assert d.schedulable and d.exclude == ["n2", "n3"]
