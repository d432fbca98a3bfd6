"""A hang names the culprit, for a script as for the built-in task: where the heartbeats know
of no collective (a script's wrapper sees only CPU time and output), each rank's own stack
dump says whether it waits in a collective; the rank that does not is the one named.

The stacks below are faulthandler's text as a hung 2-rank script's dumps read
(tests/tasks/test_script.py runs one end to end)."""

from __future__ import annotations

from pathlib import Path

from toolkit.fault.hang import collective_in_stacks, diagnose, one_line

SITE = "/work/venv/lib/python3.11/site-packages"
WAITING_IN_ALL_REDUCE = f"""\
Current thread 0x00007f3a54e16b80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2955 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/fsdp_train.py", line 56 in main
  File "/home/me/fsdp_train.py", line 67 in <module>

Thread 0x00007f3a40ff9640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap
"""
WAITING_IN_DDP_BACKWARD = f"""\
Current thread 0x00007f3a54e16b80 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 395 in backward
  File "{SITE}/torch/_tensor.py", line 623 in backward
  File "/home/me/ddp_train.py", line 56 in main
"""
IN_THE_USERS_SLEEP = """\
Current thread 0x00007f495ce86b80 (most recent call first):
  File "/home/me/fsdp_train.py", line 20 in hang
  File "/home/me/fsdp_train.py", line 52 in main
  File "/home/me/fsdp_train.py", line 67 in <module>
"""
WAITING_FOR_PEERS_TO_JOIN = f"""\
Current thread 0x00007f495ce86b80 (most recent call first):
  File "{SITE}/torch/distributed/rendezvous.py", line 200 in _create_c10d_store
  File "{SITE}/torch/distributed/distributed_c10d.py", line 1700 in init_process_group
  File "/home/me/fsdp_train.py", line 30 in main
"""
WAITING_ON_AN_ASYNC_ALL_GATHER = f"""\
Current thread 0x00007f495ce86b80 (most recent call first):
  File "{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", line 300 in foreach_all_gather_copy_out
  File "{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", line 330 in wait_for_unshard
  File "/home/me/fsdp_train.py", line 56 in main
"""
IMPORTING_IN_ITS_OWN_CODE = f"""\
Current thread 0x00007f495ce86b80 (most recent call first):
  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed
  File "{SITE}/torch/distributed/fsdp/__init__.py", line 1 in <module>
  File "/home/me/fsdp_train.py", line 3 in <module>
"""


def test_a_ranks_stacks_say_which_collective_it_waits_in():
    assert collective_in_stacks(WAITING_IN_ALL_REDUCE) == "all_reduce"
    assert collective_in_stacks(WAITING_IN_DDP_BACKWARD) == "backward"
    assert collective_in_stacks(IN_THE_USERS_SLEEP) is None
    assert collective_in_stacks(WAITING_FOR_PEERS_TO_JOIN) == "_create_c10d_store"
    assert collective_in_stacks(WAITING_ON_AN_ASYNC_ALL_GATHER) == "foreach_all_gather_copy_out"
    assert collective_in_stacks(IMPORTING_IN_ITS_OWN_CODE) is None
    assert collective_in_stacks("") is None


def script_rank(r: int, moved_unix: float) -> dict:
    """A script rank's heartbeat: its wrapper saw CPU time and output, no collective."""
    return {
        "rank": r,
        "host": "vm",
        "step": 0,
        "entered_seq": 0,
        "entered_op": "none",
        "blocked_seq": 0,
        "blocked_op": "none",
        "idle_s": 1005.0 - moved_unix,
        "moved_unix": moved_unix,
    }


def test_the_script_rank_outside_the_collective_is_named_not_both():
    # Both stopped within a second (steps are short): the heartbeats alone name both.
    ranks = [script_rank(0, 1000.6), script_rank(1, 1000.0)]
    assert diagnose(ranks)["stuck_ranks"] == [0, 1]
    stacks = {0: collective_in_stacks(WAITING_IN_ALL_REDUCE), 1: None}
    found = diagnose(ranks, stacks)
    assert found["stuck_ranks"] == [1] and found["waiting_ranks"] == [0]
    assert found["collective"] == {"op": "all_reduce", "seq": None, "from": "stacks"}
    assert one_line({**found, "message": ""}, Path("D")) == (
        "hang: rank 1 on node vm stuck outside collectives at step 0 while ranks 0 wait in "
        "all_reduce (their stacks) for 5 s; dumps in D"
    )


def test_stacks_change_nothing_where_they_cannot_tell_the_ranks_apart():
    ranks = [script_rank(0, 1000.6), script_rank(1, 1000.0)]
    both_waiting = {0: "all_reduce", 1: "all_reduce"}
    assert diagnose(ranks, both_waiting)["stuck_ranks"] == [0, 1]
    no_stacks = {0: None}  # rank 1 wrote none: it is not called outside on no evidence
    assert diagnose(ranks, no_stacks)["stuck_ranks"] == [0, 1]
