"""A report over telemetry that holds no step records (the node agent was killed before
they reached it) says the data is missing, instead of "compute (0%)" and "nan ms"."""

from __future__ import annotations

import re

from toolkit.config.telemetry import ReportConfig
from toolkit.telemetry.report.analysis import Attribution
from toolkit.telemetry.report.verdict import diagnose, summary_lines


def test_no_step_records_is_said_as_such():
    verdict = diagnose(
        series={},
        attribution=Attribution(),
        gaps=[],
        gpus=[],
        events=[],
        cfg=ReportConfig(sacct=False),
        job=None,
        predicted={"step": 0.012, "compute": 0.01},
    )
    lines = summary_lines(verdict)
    assert not verdict.measured
    assert lines[0].startswith("dominant cost: not measured: no step records reached")
    assert "step not measured vs model 12.00 ms" in lines[1]
    assert not re.search(r"\bnan\b", "\n".join(lines)) and "0%" not in "\n".join(lines)
