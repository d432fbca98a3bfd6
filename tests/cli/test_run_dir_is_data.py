"""A run directory is data, not code: every command that reads one (status, runs, report and
its HTML, watch, compare, export, perfmodel --run, plan --run) builds, imports and
instantiates nothing it names.

A run directory someone else wrote plants `_target_: os.system`, `builtins.open` and
`builtins.eval` as its model, its data and a training callback in its config.yaml, and Python
modules (json.py, numpy.py, omegaconf.py, ...) beside it that would write a marker file when
imported. After every read-only command the victim file is intact and no marker exists.

What the readers need of the model is the RUN/model.json the run recorded at its start; an
old run without one gets "no model prediction (run recorded no model.json)", never a build.
The result does not depend on Hydra's version (pyproject allows hydra-core>=1.3, whose
instantiate allow-lists differ): Hydra's instantiate is made to fail here, and nothing calls
it. The subprocess form (`cd RUN && python -m toolkit.telemetry report .`) shows that the
working directory is not on sys.path; `toolkit report` and `python -P -m ...` keep even a
planted `toolkit/` package out (docs/telemetry.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.cli.conftest import REPO, isolated_env

pytestmark = [pytest.mark.slow, pytest.mark.load_tolerant]

PLANTED_MODULES = ("json", "numpy", "omegaconf", "argparse", "rich", "h5py", "toolkit_evil")


def plant(run_dir: Path, where: Path, targets: tuple[str, str, str]) -> Path:
    """A copy of `run_dir` whose config names `targets` for model, data and a callback."""
    planted = shutil.copytree(run_dir, where)
    victim, marker = where.parent / "victim.txt", where.parent / "MARKER"
    victim.write_text("precious")
    nodes = {
        "os.system": {"_target_": "os.system", "command": f"touch {marker}"},
        "builtins.open": {"_target_": "builtins.open", "file": str(victim), "mode": "w"},
        "builtins.eval": {"_target_": "builtins.eval", "_args_": [f"open({str(marker)!r}, 'w')"]},
    }
    config = OmegaConf.to_container(OmegaConf.load(planted / "config.yaml"))
    model, data, callback = (nodes[t] for t in targets)
    config["model"] = {**model, "name": "planted"}
    config["data"] = {**data, "name": "planted"}
    config["trainer"]["callbacks"] = [callback]
    (planted / "config.yaml").write_text(OmegaConf.to_yaml(config))
    for name in PLANTED_MODULES:
        (planted / f"{name}.py").write_text(
            f"open({str(marker)!r} + '-{name}', 'w').write('imported')\n"
        )
    return planted


def untouched(where: Path) -> None:
    assert (where / "victim.txt").read_text() == "precious"
    assert sorted(p.name for p in where.glob("MARKER*")) == []


@pytest.fixture
def no_instantiate(monkeypatch):
    """Hydra's instantiate fails loudly if anything calls it (whatever Hydra's version)."""
    import hydra._internal.instantiate._instantiate2 as impl
    import hydra.utils

    def refuse(*args, **kwargs):
        raise AssertionError(f"instantiate called on {args[:1]}")

    monkeypatch.setattr(hydra.utils, "instantiate", refuse)
    monkeypatch.setattr(impl, "instantiate", refuse)


@pytest.mark.parametrize(
    "targets",
    [
        ("os.system", "builtins.open", "builtins.eval"),
        ("builtins.open", "builtins.eval", "os.system"),
        ("builtins.eval", "os.system", "builtins.open"),
    ],
)
def test_no_read_only_command_runs_what_a_run_dir_names(
    samples_run, tmp_path, capsys, no_instantiate, targets
):
    from toolkit.cli.export import main as export
    from toolkit.cli.status import runs, status
    from toolkit.perfmodel.__main__ import main as perfmodel
    from toolkit.plan import main as plan
    from toolkit.telemetry.cli import main as telemetry

    run = plant(samples_run, tmp_path / "root" / "run", targets)
    other = plant(samples_run, tmp_path / "root" / "other", targets)
    assert status(str(run), as_json=True) == 0
    assert runs(str(tmp_path / "root"), as_json=True) == 0
    assert telemetry(["report", str(run), "--no-sacct", "--no-plots"]) == 0
    assert telemetry(["watch", str(run), "--once"]) == 0
    assert telemetry(["compare", str(run), str(other)]) == 0
    assert export([str(run), str(tmp_path / "model.safetensors")]) == 0
    assert perfmodel(["--run", str(run), "--json"]) == 0
    assert plan(["--run", str(run), "--top", "1"]) == 0
    out = capsys.readouterr().out
    # The recorded model (RUN/model.json) is predicted: samples/s from its counted FLOPs.
    assert '"unit": "samples"' in out and "samples/s" in out
    untouched(tmp_path / "root")


def test_an_old_run_without_model_json_gets_no_prediction_and_no_build(
    samples_run, tmp_path, capsys, no_instantiate
):
    from toolkit.config.telemetry import ReportConfig
    from toolkit.perfmodel.__main__ import main as perfmodel
    from toolkit.telemetry.report.build import build_report

    run = plant(samples_run, tmp_path / "root" / "run", ("builtins.open",) * 3)
    (run / "model.json").unlink()
    report = build_report(run, None, ReportConfig(sacct=False, plots=False))
    assert "no model prediction (run recorded no model.json)" in report.verdict.notes
    assert Path(report.outputs["html"]).is_file()
    assert perfmodel(["--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {run}: no model prediction (run recorded no model.json)"
    untouched(tmp_path / "root")


def test_a_damaged_model_json_is_one_note_not_a_traceback(samples_run, tmp_path):
    from toolkit.runmodel import run_model_or_note

    run = shutil.copytree(samples_run, tmp_path / "run")
    recorded = json.loads((run / "model.json").read_text())
    (run / "model.json").write_text(json.dumps({**recorded, "flops_per_sample": [1]}))
    model, note = run_model_or_note(run)
    assert model is None
    assert note == (
        f"no model prediction ({run / 'model.json'}: flops_per_sample=[1]: "
        "not a finite number >= 0)"
    )


@pytest.mark.parametrize(
    ("command", "printed"),
    [
        (["toolkit.telemetry", "report", ".", "--no-sacct", "--no-plots"], "report:"),
        (["toolkit.perfmodel", "--run", ".", "--json"], '"unit": "samples"'),
    ],
)
def test_a_command_started_inside_the_run_dir_imports_nothing_from_it(
    samples_run, tmp_path, command, printed
):
    """`cd RUN && python -m toolkit.telemetry report .` (or `toolkit.perfmodel --run .`):
    python -m puts the working directory first on sys.path; the command takes it off before
    importing anything else. Importing the package toolkit.perfmodel (which runs before its
    __main__) loads nothing, so numpy, omegaconf and hydra are searched for after that."""
    run = plant(samples_run, tmp_path / "root" / "run", ("os.system",) * 3)
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=run,
        env=isolated_env(tmp_path, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert printed in done.stdout
    untouched(tmp_path / "root")


def test_importing_the_perfmodel_package_imports_nothing_else():
    """Its public names are loaded on first use (PEP 562), each from the module defining it."""
    code = (
        "import sys, toolkit.perfmodel as p\n"
        "print(sorted(m for m in ('numpy', 'omegaconf', 'hydra', 'torch', 'typing')"
        " if m in sys.modules))\n"
        "from toolkit.perfmodel import Layout, predict_job\n"
        "import toolkit.perfmodel.job as job, toolkit.perfmodel.model as model\n"
        "print(predict_job is job.predict_job, Layout is model.Layout)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "True True"]


def test_an_ensembles_recorded_model_counts_its_members():
    """An ensemble of K records one member's counts and K; the performance model takes K
    times the arithmetic, parameters and saved activations per sample."""
    from toolkit.perfmodel.count_job import shape_of_run_model
    from toolkit.runmodel import from_dict

    member = {
        "name": "WindowMLP",
        "unit": "samples",
        "flops_per_sample": 3264.0,
        "forward_flops_per_sample": 1600.0,
        "num_params": 818,
        "param_bytes": 13088,
        "tokens_per_sample": 0,
        "saved_bytes_per_sample": 74.0,
        "units": 1,
        "input_shape": [16, 3],
    }
    one = shape_of_run_model(from_dict({**member, "ensemble": 1}))
    four = shape_of_run_model(from_dict({**member, "ensemble": 4}))
    assert (one.flops_per_sample, one.num_params) == (3264.0, 818)
    assert (four.flops_per_sample, four.forward_flops_per_sample) == (4 * 3264.0, 4 * 1600.0)
    assert (four.num_params, four.saved_bytes_per_sample) == (4 * 818, 4 * 74.0)
