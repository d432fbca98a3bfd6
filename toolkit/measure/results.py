"""Read a finished run directory and turn it into benchmark results (HDF5 + JSON).

A run directory written by the launcher holds config.yaml, launch.yaml, env.json,
metrics/rank<k>.jsonl (StepRecord per step), metrics/events-rank<k>.jsonl (eval events),
summary.json and, for task=bench_train, bench/memory-rank<k>.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from omegaconf import OmegaConf

from toolkit.config.compose import load_job
from toolkit.config.model import TransformerConfig, display_name
from toolkit.events import read_steps
from toolkit.measure.stats import (
    PHASES,
    measured_split,
    step_statistics,
    steps_by_number,
    time_to_target,
)
from toolkit.perfmodel import Prediction, predict_job
from toolkit.perfmodel.count_job import shape_of_run_model
from toolkit.perfmodel.counted_model import CountedShape
from toolkit.perfmodel.job import layout_from_job
from toolkit.perfmodel.model import PHASE_OF_TERM, TERMS
from toolkit.perfmodel.split import MEASURED_FIELD, predicted_split
from toolkit.redact import redact_text
from toolkit.runmodel import MODEL_FILE, read_run_model
from toolkit.train.flops import flops_per_token

STEP_FIELDS = ("step", "wall_time", "step_time_s", *PHASES, "loss", "tokens_per_s", "mfu")
STEP_FIELDS_INT = ("mem_peak_bytes",)


def rank_files(run_dir: Path, prefix: str) -> list[Path]:
    """metrics/<prefix><k>.jsonl for every rank k, in rank order."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)\.jsonl")
    found = []
    for p in (run_dir / "metrics").glob(f"{prefix}*.jsonl"):
        m = pattern.fullmatch(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def print_json(result: Any, path: Path | None = None) -> None:
    """A benchmark's result: printed as indented JSON, and written to `path` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def measured_memory(run_dir: Path, peak_bytes: int) -> dict[str, int | None]:
    """Growth over the memory in use before the model was built (max over ranks):
    persistent = after the first step (parameters + optimizer state), peak = the step
    records' peak (CUDA max_memory_allocated, or the process's max RSS on CPU)."""
    probes = [read_json(p) for p in sorted((run_dir / "bench").glob("memory-rank*.json"))]
    probes = [p for p in probes if p and "after_first_step" in p]
    if not probes:
        return {"persistent_bytes": None, "peak_memory_growth_bytes": None}
    key = "allocated_bytes" if probes[0]["device"] == "cuda" else "rss_bytes"
    persistent = max(p["after_first_step"][key] - p["before_build"][key] for p in probes)
    baseline = min(p["before_build"][key] for p in probes)
    return {"persistent_bytes": persistent, "peak_memory_growth_bytes": peak_bytes - baseline}


def recorded_shape(run_dir: Path, job: Any) -> CountedShape | None:
    """A model of yours (not a built-in transformer) as its run counted it: RUN/model.json
    (toolkit.runmodel), plain data, nothing built; None for a built-in transformer."""
    if isinstance(job.model, TransformerConfig):
        return None
    recorded = read_run_model(run_dir)
    if recorded is None:
        raise FileNotFoundError(f"{run_dir}/{MODEL_FILE}: the run recorded no model counts")
    return shape_of_run_model(recorded)


def analyze_run(run_dir: Path, warmup: int) -> tuple[dict[str, Any], Prediction]:
    """The benchmark summary of one run and the model's prediction for it."""
    job = load_job(run_dir / "config.yaml")
    records = [read_steps(p) for p in rank_files(run_dir, "rank")]
    if not records or not records[0]:
        raise FileNotFoundError(f"{run_dir}/metrics: no step records (did the run fail?)")
    world = len(records)
    steps = steps_by_number(records)
    event_files = rank_files(run_dir, "events-rank")
    events = [e for e in read_steps(event_files[0]) if e["name"] == "eval"] if event_files else []
    counted = recorded_shape(run_dir, job)
    prediction = predict_job(job, world, counted)
    stats = step_statistics(
        steps,
        warmup,
        world_size=world,
        flops_per_token=float(prediction.flops["flops_per_token"])
        if counted is not None
        else flops_per_token(job.model, job.data.seq_len),
        peak_flops=job.hardware.peak_flops(job.precision.param_dtype),
    )
    run_summary = read_json(run_dir / "summary.json") or {}
    launch = read_json_yaml(run_dir / "launch.yaml")
    predicted_phase = PHASE_OF_TERM[prediction.dominant]
    summary: dict[str, Any] = {
        "run_dir": str(run_dir),
        "overrides": launch.get("overrides", []),
        "model": display_name(job.model),
        "precision": job.precision.name,
        "hardware": job.hardware.name,
        "world_size": world,
        "nodes": job.cluster.nodes,
        # per data-parallel rank: tp and pp ranks share their group's micro-batch
        "micro_batch_size": layout_from_job(job, world).micro_batch_size,
        "grad_accum": job.trainer.grad_accum,
        "seq_len": job.data.seq_len,
        "activation_checkpointing": job.parallel.activation_checkpointing,
        "compile": job.parallel.compile,
        **stats,
        **measured_memory(run_dir, stats["peak_memory_bytes"]),
        "predicted_step_s": prediction.step_s,
        "predicted_tokens_per_s": prediction.tokens_per_s,
        "predicted_peak_memory_bytes": prediction.memory["peak_bytes"],
        "predicted_dominant": prediction.dominant,
        "predicted_fits": prediction.fits,
        **{
            f"predicted_{k}": v
            for k, v in prediction.utilisation(
                job.hardware.peak_flops(job.precision.param_dtype)
            ).items()
        },
        **{f"predicted_{t}_s": prediction.time[f"{t}_s"] for t in TERMS},
        "predicted_forward_backward_s": prediction.time["forward_backward_s"],
        "predicted_optimizer_s": prediction.time["optimizer_s"],
        **split_columns(prediction, measured_split(records, warmup, MEASURED_FIELD)),
        "step_time_ratio": stats["step_time_s_median"] / prediction.step_s,
        "dominant_match": predicted_phase == stats["measured_dominant"],
        "stop_reason": run_summary.get("stop_reason"),
        "val_loss": run_summary.get("val_loss"),
        **time_to_target(steps, events, job.trainer.target_val_loss),
    }
    summary["results_h5"] = str(run_dir / "bench" / "results.h5")
    write_h5(run_dir / "bench" / "results.h5", records, events, summary, prediction, run_dir)
    (run_dir / "bench" / "result.json").write_text(json.dumps(summary) + "\n")
    return summary, prediction


def split_columns(
    prediction: Prediction, measured: dict[str, float | None]
) -> dict[str, float | None]:
    """`split_predicted_<part>_s` and `split_measured_<part>_s` for every part of the step's
    split (compute, exposed communication, optimizer, data wait, checkpoint stall, step):
    toolkit.perfmodel.split says how the model's terms map onto the measured parts."""
    predicted = predicted_split(prediction.time)
    out: dict[str, float | None] = {}
    for part in MEASURED_FIELD:
        out[f"split_predicted_{part}_s"] = predicted[part]
        out[f"split_measured_{part}_s"] = measured.get(part)
    return out


def read_json_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = OmegaConf.to_container(OmegaConf.load(path))
    return data if isinstance(data, dict) else {}


def _scalar(value: Any) -> Any:
    if value is None:
        return "none"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


def write_h5(
    path: Path,
    records_by_rank: list[list[dict[str, Any]]],
    evals: list[dict[str, Any]],
    summary: dict[str, Any],
    prediction: Prediction,
    run_dir: Path,
) -> None:
    """Layout: /steps/<field> [rank, step]; /eval/{step,val_loss,end}; /summary and
    /prediction/<part> as attributes; /run/{config_yaml,launch_yaml,env_json} as strings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    num_steps = min(len(r) for r in records_by_rank)
    with h5py.File(path, "w") as f:
        steps = f.create_group("steps")
        steps.attrs["warmup_steps"] = summary["warmup_steps"]
        for name in STEP_FIELDS + STEP_FIELDS_INT:
            dtype = np.int64 if name in STEP_FIELDS_INT + ("step",) else np.float64
            data = np.array([[r[name] for r in recs[:num_steps]] for recs in records_by_rank])
            steps.create_dataset(name, data=data.astype(dtype))
        ev = f.create_group("eval")
        ev.create_dataset("step", data=np.array([e["step"] for e in evals], dtype=np.int64))
        ev.create_dataset("val_loss", data=np.array([e["attrs"]["val_loss"] for e in evals]))
        ev.create_dataset("end", data=np.array([e["end"] for e in evals], dtype=np.float64))
        s = f.create_group("summary")
        for key, value in summary.items():
            s.attrs[key] = _scalar(value)
        pred = f.create_group("prediction")
        for part, values in prediction.as_dict().items():
            if isinstance(values, dict):
                g = pred.create_group(part)
                for key, value in values.items():
                    g.attrs[key] = value
            else:
                pred.attrs[part] = values
        run = f.create_group("run")
        for name, file in (
            ("config_yaml", "config.yaml"),
            ("launch_yaml", "launch.yaml"),
            ("env_json", "env.json"),
        ):
            p = run_dir / file
            # config.yaml is kept verbatim in the run dir (the ranks run it); copies are redacted.
            run.create_dataset(name, data=redact_text(p.read_text()) if p.exists() else "")
