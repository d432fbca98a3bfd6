"""A step table's rate columns carry their own unit in the node HDF5 file: `tokens_per_s` is
"tokens/s" and `samples_per_s` is "samples/s" (a samples model's rate), as written and as
read back."""

from __future__ import annotations

import dataclasses

from toolkit.events import StepRecord
from toolkit.telemetry.h5store import NodeFileWriter
from toolkit.telemetry.read import load_node
from toolkit.telemetry.schema import steps_spec, units_for


def test_every_rate_column_is_in_its_own_unit_per_second(tmp_path):
    path = tmp_path / "node.h5"
    writer = NodeFileWriter(path, [steps_spec(0)], {"node": "n0"})
    writer.close()
    node = load_node(path)
    try:
        steps = node.steps[0]
        assert steps.units("samples_per_s") == "samples/s"
        assert steps.units("tokens_per_s") == "tokens/s"
        assert steps.units("step_time_s") == "s"
    finally:
        node.close()
    rates = [f.name for f in dataclasses.fields(StepRecord) if f.name.endswith("_per_s")]
    assert rates and all(units_for(r) == r.removesuffix("_per_s") + "/s" for r in rates)
