"""The checkpoint's background threads give way to training; the training thread keeps its
priority."""

import threading

import pytest

from toolkit.checkpoint.priority import describe_this_thread, lower_this_thread


def in_a_thread(priority: str) -> tuple[str, str]:
    seen: list[str] = []

    def work() -> None:
        lower_this_thread(priority)
        seen.append(describe_this_thread())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return seen[0], describe_this_thread()


@pytest.mark.parametrize("priority", ["idle", "low", "normal"])
def test_only_the_calling_thread_is_lowered(priority):
    background, training = in_a_thread(priority)
    assert background == priority
    assert training == "normal"


def test_an_unknown_priority_is_refused():
    with pytest.raises(ValueError, match="allowed idle, low, normal"):
        lower_this_thread("realtime")
