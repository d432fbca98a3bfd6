"""What a run directory says about its run: state, progress, checkpoints, attempts, files.

Read only from what the launcher and the ranks wrote (config.yaml, launch.yaml,
summary.json, metrics/, logs/, checkpoints/, slurm.json); Slurm is asked only for the state
of a job that has not ended by the files' account.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from toolkit import slurm_cli
from toolkit.errors import EXIT_HANG, EXIT_PREEMPTED
from toolkit.fault.hang import hang_summaries
from toolkit.runmodel import UNITS, RunModelUnreadable, read_run_model
from toolkit.tracking.build import tracker_links

# dead: no summary, no error file, and the process that held the run dir's lock is gone
# (a killed launcher): nothing runs there any more.
# hung: the hang watchdog ended it (exit 79), its hang summary newer than any step record.
STATES = ("running", "completed", "failed", "preempted", "requeued", "dead", "hung", "unknown")


@dataclass
class RunInfo:
    run_dir: str
    state: str  # one of STATES
    steps: int | None = None  # last step recorded
    total_steps: int | None = None
    loss: float | None = None  # the final loss, else the last one recorded
    tokens_per_s: float | None = None  # median over the run when it ended, else the last step
    unit: str = "tokens"  # the model's throughput unit: tokens | samples (RUN/model.json)
    samples_per_s: float | None = None  # as tokens_per_s, in samples
    mfu: float | None = None  # median over the run when it ended, else the last step
    last_checkpoint: str | None = None  # the newest committed one
    attempts: int = 1  # starts of the job: 1 + restarts (requeues, relaunches that resumed)
    job_id: str | None = None
    slurm_state: str | None = None
    stop_reason: str | None = None
    exit_code: int | None = None
    # The command line's overrides that change something: hydra.* and those that set what the
    # defaults set anyway are left out.
    overrides: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # what -> path
    trackers: dict[str, str] = field(default_factory=dict)  # tracker -> its run's URL or files
    script: str | None = None  # a script run: its command line, secret values redacted

    def as_dict(self) -> dict:
        return asdict(self)


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "launch.yaml").is_file()


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


def last_record(path: Path, block_bytes: int = 1 << 16) -> dict | None:
    """The last complete JSON object of a JSON-lines file with a "step", read from the end
    (a block at a time, as far back as needed): `status` on a long run reads kilobytes, not
    the whole file. A line being written or a malformed one is passed over."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        while end > 0:
            start = max(0, end - block_bytes)
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
            lines = tail.split(b"\n")
            complete = lines if start == 0 else lines[1:]  # the first may be cut
            for line in reversed(complete):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    return record
            tail = lines[0] if start > 0 else b""
    return None


def _attempt_of(record: dict | None) -> int:
    """The attempt that wrote a step record (0 before records carried one)."""
    value = (record or {}).get("attempt", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class RunDirUnreadable(Exception):
    """A run directory's own record is damaged; the message says which file (one line)."""


def _json_object(path: Path) -> dict | None:
    """The JSON object in `path`, None when absent; RunDirUnreadable when it is not one."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError) as exc:
        raise RunDirUnreadable(f"{path}: unreadable ({exc})") from None
    if not isinstance(value, dict):
        raise RunDirUnreadable(f"{path}: not a JSON object but a {type(value).__name__}")
    return value


NUMBER = (int, float)


def typed(record: dict, key: str, kinds: tuple[type, ...], path: Path) -> Any:
    """record[key] when it is None or of `kinds` (a bool is no number); RunDirUnreadable
    naming the file and the field otherwise: valid JSON of the wrong type (`"final_loss":
    [1]`, `"loss": "NaN"`) is one line, never a traceback."""
    value = record.get(key)
    if value is None or (isinstance(value, kinds) and not isinstance(value, bool)):
        return value
    what = {NUMBER: "a number", (int,): "a whole number", (str,): "a string"}.get(kinds, "valid")
    raise RunDirUnreadable(f"{path}: {key}={json.dumps(value)}: not {what}")


def _last_checkpoint(run_dir: Path) -> str | None:
    folder = run_dir / "checkpoints"
    committed = sorted(p for p in folder.glob("step-*") if (p / "manifest.json").is_file())
    return str(committed[-1]) if committed else None


def slurm_state(job_id: str) -> str | None:
    """Slurm's state of a job (None when Slurm cannot be asked)."""
    return slurm_cli.state_word(job_id)


def lock_holder_died(run_dir: Path) -> bool:
    """Whether RUN/.lock names a local holder ({pid, host, slurm_job_id}) on this host whose
    kernel flock is gone: the process that wrote into the run dir (and every rank, which
    inherit the lock) ended without a summary. Read from /proc/locks, which lists every
    flock with its file's device and inode, so that asking takes no lock; without it, from
    whether the recorded pid lives. False whenever it cannot be told (another host, a Slurm
    job, no lock file)."""
    path = run_dir / ".lock"
    try:
        record = json.loads(path.read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("slurm_job_id"):
        return False  # a Slurm job holds its run dir: Slurm says whether it lives
    if record.get("host") != socket.gethostname():
        return False  # a flock is seen on its own host only
    try:
        with open("/proc/locks") as f:
            locks = f.read()
    except OSError:
        pid = record.get("pid")
        return isinstance(pid, int) and not isinstance(pid, bool) and not _pid_alive(pid)
    # "1: FLOCK  ADVISORY  WRITE 4242 00:2d:5678 0 EOF": the inode is enough (a match on
    # another device only keeps the run "running", as before this check).
    inode = f":{st.st_ino}"
    return not any(
        fields[1:2] == ["FLOCK"] and len(fields) > 5 and fields[5].endswith(inode)
        for fields in (line.split() for line in locks.splitlines())
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _state(summary: dict | None, run_dir: Path, slurm: str | None, restarts: int) -> str:
    if summary is not None:
        if summary.get("exit_code") == EXIT_PREEMPTED or str(
            summary.get("stop_reason", "")
        ).startswith("signal"):
            return "requeued" if slurm in ("PENDING", "RUNNING", "REQUEUED") else "preempted"
        return "completed" if summary.get("exit_code") == 0 else "failed"
    if any((run_dir / "logs").glob("error-rank*.txt")):
        return "failed"
    if slurm is not None:
        if slurm in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING"):
            return "requeued" if restarts and slurm != "RUNNING" else "running"
        if slurm == "PREEMPTED":
            return "preempted"
        return "failed" if slurm != "COMPLETED" else "completed"
    if lock_holder_died(run_dir):
        return "dead"
    return "running" if (run_dir / "metrics").is_dir() else "unknown"


def last_hang(run_dir: Path, metrics_path: Path) -> dict | None:
    """The newest hang summary of the run (toolkit.fault.hang), unless a step was recorded
    after it (a requeued attempt that went on is not hung)."""
    found = hang_summaries(run_dir)
    if not found:
        return None
    path, summary = found[-1]
    with contextlib.suppress(OSError):
        if metrics_path.stat().st_mtime > path.stat().st_mtime + 1.0:
            return None
    return summary


def script_command_line(script: Any) -> str:
    """A script run's command line (config.yaml's script group, as plain data), with secret
    values redacted: what `status` shows in place of the default model's settings."""
    from toolkit.config.script import ScriptConfig
    from toolkit.redact import redact_text

    cfg = ScriptConfig(
        path=script.get("path"),
        module=script.get("module"),
        args=[str(a) for a in script.get("args") or []],
        python=script.get("python"),
    )
    return redact_text(cfg.command_line())


def read_run(run_dir: Path, ask_slurm: bool = True) -> RunInfo:
    """Everything `toolkit status` and `toolkit runs` show about one run directory; raises
    RunDirUnreadable naming the file when one of its records is damaged."""
    run_dir = run_dir.resolve()
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics" / "rank0.jsonl"
    summary = _json_object(summary_path)
    try:
        launch = OmegaConf.to_container(OmegaConf.load(run_dir / "launch.yaml"))
        config = OmegaConf.load(run_dir / "config.yaml")
        script = config.get("script") or {}
        # Your own script decides how many steps it takes: trainer.steps is not its total.
        ran_script = bool(script.get("path") or script.get("module"))
        total_steps = None if ran_script else int(config.trainer.steps)
        script_line = script_command_line(script) if ran_script else None
    except Exception as exc:  # noqa: BLE001 - YAML, OmegaConf and key errors alike
        raise RunDirUnreadable(
            f"{run_dir}: config.yaml or launch.yaml unreadable ({exc})"
        ) from None
    last = last_record(metrics_path)
    events = _jsonl(run_dir / "metrics" / "events-rank0.jsonl")
    restarts = sum(1 for e in events if isinstance(e, dict) and e.get("name") == "restart")
    job_id = None
    slurm_record = _json_object(run_dir / "slurm.json")
    if slurm_record is not None and "job_id" in slurm_record:
        job_id = str(slurm_record["job_id"])
    slurm = slurm_state(job_id) if job_id and ask_slurm and summary is None else None
    info = RunInfo(
        run_dir=str(run_dir),
        state=_state(summary, run_dir, slurm, restarts),
        total_steps=total_steps,
        # A local resume writes no restart event: the records' own attempt counts as well.
        attempts=1 + max(restarts, _attempt_of(last)),
        job_id=job_id,
        slurm_state=slurm,
        last_checkpoint=_last_checkpoint(run_dir),
        overrides=differing_overrides(launch["overrides"], launch.get("choices") or {}, config),
    )
    if last is not None:
        info.steps = last["step"]
        info.loss = typed(last, "loss", NUMBER, metrics_path)
        info.tokens_per_s = typed(last, "tokens_per_s", NUMBER, metrics_path)
        info.samples_per_s = typed(last, "samples_per_s", NUMBER, metrics_path)
        info.mfu = typed(last, "mfu", NUMBER, metrics_path)
    if summary is not None:
        if "steps" in summary:
            info.steps = typed(summary, "steps", (int,), summary_path)
        for field_name, key in (
            ("loss", "final_loss"),
            ("tokens_per_s", "median_tokens_per_s"),
            ("samples_per_s", "median_samples_per_s"),
            ("mfu", "median_mfu"),
        ):
            if key in summary:
                setattr(info, field_name, typed(summary, key, NUMBER, summary_path))
        info.stop_reason = typed(summary, "stop_reason", (str,), summary_path)
        info.exit_code = typed(summary, "exit_code", (int,), summary_path)
    # Ended by the hang watchdog (exit 79): no summary of its own, and a "running" that
    # Slurm does not confirm is a local run whose ranks the watchdog ended.
    ended = info.state in ("dead", "failed", "unknown") or (info.state, slurm) == ("running", None)
    hang = last_hang(run_dir, metrics_path) if ended and summary is None else None
    if hang is not None:
        info.state, info.stop_reason, info.exit_code = "hung", hang["message"], EXIT_HANG
    info.unit = throughput_unit(run_dir, summary, summary_path)
    info.script = script_line
    info.files = written_files(run_dir)
    info.trackers = tracker_links(run_dir)
    return info


def _member_settings(path: Path) -> list[str]:
    """A member's own settings (member.json) as key=value, as its run's overrides."""
    record = _json_object(path) or {}
    keys = ("seed", "lr", "weight_decay", "warmup_steps", "dropout")
    return [f"{k}={record[k]}" for k in keys if record.get(k) is not None]


def read_members(run: RunInfo) -> list[RunInfo]:
    """An ensemble's members (trainer.ensemble; RUN/members/<name>/), each listed like a run
    from its own files: its steps, loss and summary, the run's state and attempts. A member
    dropped for a non-finite loss is failed, its stop reason naming the step."""
    folder = Path(run.run_dir) / "members"
    if not folder.is_dir():
        return []
    infos = []
    for member in sorted(p for p in folder.iterdir() if (p / "member.json").is_file()):
        summary = _json_object(member / "summary.json")
        last = last_record(member / "metrics" / "rank0.jsonl")
        info = RunInfo(
            run_dir=str(member),
            state=run.state,
            total_steps=run.total_steps,
            attempts=run.attempts,
            job_id=run.job_id,
            slurm_state=run.slurm_state,
            last_checkpoint=run.last_checkpoint,
            overrides=[f"member={member.name}", *_member_settings(member / "member.json")],
        )
        info.unit = run.unit
        metrics, summary_path = member / "metrics" / "rank0.jsonl", member / "summary.json"
        if last is not None:
            info.steps, info.loss = last["step"], typed(last, "loss", NUMBER, metrics)
            info.tokens_per_s = typed(last, "tokens_per_s", NUMBER, metrics)
            info.samples_per_s = typed(last, "samples_per_s", NUMBER, metrics)
        if summary is not None:
            if "final_loss" in summary:
                info.loss = typed(summary, "final_loss", NUMBER, summary_path)
            info.stop_reason = typed(summary, "stop_reason", (str,), summary_path)
            info.exit_code = typed(summary, "exit_code", (int,), summary_path)
            dropped = typed(summary, "dropped_at_step", (int,), summary_path)
            if dropped is not None:
                info.state = "failed"
                info.stop_reason = f"dropped at step {dropped}: non-finite loss or grad norm"
        infos.append(info)
    return infos


def throughput_unit(run_dir: Path, summary: dict | None, summary_path: Path) -> str:
    """The model's unit: RUN/model.json's (recorded at the run's start), else the summary's
    `throughput_unit`, else tokens (an older run of a token model)."""
    try:
        recorded = read_run_model(run_dir)
    except RunModelUnreadable as exc:
        raise RunDirUnreadable(str(exc)) from None
    if recorded is not None:
        return recorded.unit
    unit = typed(summary or {}, "throughput_unit", (str,), summary_path)
    if unit is not None and unit not in UNITS:
        raise RunDirUnreadable(f"{summary_path}: throughput_unit={unit!r}: not one of {UNITS}")
    return unit or "tokens"


@functools.cache
def _defaults() -> tuple[dict, dict]:
    """(default choice per group, the default job as a nested dict), composed once."""
    from toolkit.config.compose import compose_raw, job_to_dict, to_job

    cfg = compose_raw([])
    return OmegaConf.to_container(cfg.hydra.runtime.choices), job_to_dict(to_job(cfg))


def _value_at(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


_MISSING = object()


def differing_overrides(overrides: list[str], choices: dict, config: Any) -> list[str]:
    """The overrides that make this run differ from the defaults: a group option other than
    the default one, a value other than the default job's (hydra.* left out)."""
    default_choices, default_job = _defaults()
    run_job = OmegaConf.to_container(config)
    kept = []
    for item in overrides:
        key, _, _ = item.lstrip("+~").partition("=")
        if key.startswith("hydra.") or key == "hydra":
            continue
        if key in default_choices:  # group=option
            if choices.get(key, default_choices[key]) != default_choices[key]:
                kept.append(item)
        elif _value_at(run_job, key) != _value_at(default_job, key):
            kept.append(item)
    return kept


def written_files(run_dir: Path) -> dict[str, str]:
    """The run's outputs that exist, by what they are."""
    candidates = {
        "config": "config.yaml",
        "launch": "launch.yaml",
        "summary": "summary.json",
        "model": "model.json",
        "environment": "env.json",
        "metrics": "metrics/rank0.jsonl",
        "events": "metrics/events-rank0.jsonl",
        "logs": "logs",
        "checkpoints": "checkpoints",
        "telemetry": "telemetry",
        "slurm": "slurm",
        "tracking": "tracking",
    }
    return {
        what: str(run_dir / rel) for what, rel in candidates.items() if (run_dir / rel).exists()
    }


def find_runs(root: Path) -> list[Path]:
    """Every run directory under root (root itself included), sorted by path."""
    if is_run_dir(root):
        return [root]
    found = {p.parent.resolve() for p in root.rglob("launch.yaml") if is_run_dir(p.parent)}
    return sorted(found)
