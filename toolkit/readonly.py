"""The commands that read a run directory run no code of it: the working directory (which
`python -m` and `python -c` put first on sys.path) is taken off sys.path before they import
anything else, so that a `json.py` or `numpy.py` placed in a run directory is never imported
by `cd RUN && python -m toolkit.telemetry report .`.

The package itself is found before this runs: a `toolkit/` folder placed in the working
directory would shadow this one. The safe forms are the installed command (`toolkit report
RUN`, whose sys.path starts with its own bin directory) and `python -P -m toolkit.telemetry
report RUN` (Python 3.11's -P: no unsafe path first).

Imports only `os` and `sys`, both loaded before any user path is searched."""

from __future__ import annotations

import os
import sys

# `toolkit SUBCOMMAND`s that only read run directories and checkpoints.
READ_ONLY_COMMANDS = frozenset({"status", "runs", "report", "watch", "compare", "export", "track"})


def drop_working_dir() -> None:
    """Remove the working directory ('' or its absolute path) from sys.path."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed: only '' can name it
        cwd = None
    sys.path[:] = [
        p for p in sys.path if p not in ("", ".") and (cwd is None or os.path.realpath(p) != cwd)
    ]
