"""The child the rank wrapper starts (toolkit.tasks.script):
`python -m toolkit.tasks.script_runner RUN_DIR (--path FILE | --module NAME) -- ARGS...`.

Installs the stack dump for the hang watchdog (DUMP_SIGNAL; its file is removed at the end
when nothing was dumped into it), then runs the script as
`__main__` with sys.argv as `python FILE ARGS` or `python -m NAME ARGS` would set it. A
failure keeps its traceback in RUN_DIR/logs/error-rank<k>.txt for the launcher to show.
After the script returns, its torch objects are released while the interpreter is still
whole (`release_torch_state`).
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    run_dir, kind, target = Path(argv[0]), argv[1], argv[2]
    args = argv[4:] if len(argv) > 3 and argv[3] == "--" else argv[3:]
    rank = int(os.environ.get("RANK", "0"))
    from toolkit.fault.hang import install_stack_dump, remove_stack_dump

    install_stack_dump(run_dir, rank)
    try:
        return run_script(run_dir, rank, kind, target, args)
    finally:
        remove_stack_dump()  # the stack file, unless a dump wrote to it (docs/fault.md)


def run_script(run_dir: Path, rank: int, kind: str, target: str, args: list[str]) -> int:
    """Run the script (`--path FILE` or `--module NAME`) as `__main__`: 0, 1 after a
    failure (its traceback kept for the launcher), or SystemExit with its own status. The
    rank's wrapper calls it in its own process (toolkit.tasks.script.run_here)."""
    try:
        if kind == "--module":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()  # as `python -m` does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = str(Path(target).parent)  # as `python FILE` does
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        code = stop.code  # raised again below, once the script's frames are gone
    except BaseException:  # noqa: BLE001 - the script's failure, with its rank, for the launcher
        text = traceback.format_exc()
        sys.stderr.write(text)
        try:
            (run_dir / "logs").mkdir(parents=True, exist_ok=True)
            (run_dir / "logs" / f"error-rank{rank}.txt").write_text(text)
        finally:
            sys.stderr.flush()
        return 1
    else:
        code = 0
    if code not in (None, 0):
        raise SystemExit(code)
    release_torch_state()
    return 0


def release_torch_state() -> None:
    """Free what the script left of torch while the interpreter is still whole: a process
    group it did not destroy, and the objects caught in reference cycles (a DDP module, its
    reducer, gloo's pending work) that the interpreter would otherwise free only during
    finalisation. Freed there, gloo's worker threads can abort the process after a
    successful run ("terminate called without an active exception", exit 134; seen once in
    CI on a script that had destroyed its process group; pytorch/pytorch#179291 describes
    the same crash for one that had not)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
