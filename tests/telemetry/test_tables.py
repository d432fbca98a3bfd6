"""The node and rank tables: one column spec, each formatter written once."""

from __future__ import annotations

import math

from toolkit.telemetry.report.tables import (
    NODE_COLUMNS,
    NODE_HEADER,
    PERFORMANCE_COLUMNS,
    RANK_COLUMNS,
    RANK_HEADER,
    table_rows,
)

NODE_ROW = {
    "node": "gpu-node003",
    "attempts": [0, 1],
    "ranks": 4,
    "gpus": 4,
    "median_step_s": 0.5004,
    "p99_step_s": 0.5842,
    "median_tokens_per_s": 2095634.4,
    "median_mfu": 0.4372,
    "data_wait_share": 0.0201,
    "gpu_util_pct": 89.24,
    "power_w": 2396.2,
    "throttle_s": 177.0,
    "ib_xmit_bytes_per_s": 162.66e9,
    "straggler_score": 0.0004,
}
RANK_ROW = {
    "node": "gpu-node003",
    "rank": 13,
    "steps": 820,
    "median_step_s": 0.571,
    "p99_step_s": 0.5842,
    "median_tokens_per_s": 1836458.0,
    "median_mfu": 0.383,
    "data_wait_share": 0.0199,
    "gpu_util_pct": 89.3,
    "power_w": 599.4,
    "throttle_s": 177.0,
    "straggler_score": 0.1423,
}


def test_both_tables_show_the_same_performance_columns_then_the_straggler_score():
    shared = [c.header for c in PERFORMANCE_COLUMNS]
    assert NODE_HEADER[4:12] == shared and RANK_HEADER[3:11] == shared
    assert NODE_HEADER[0] == RANK_HEADER[0] == "node"
    # print_report sorts rank rows by their last cell.
    assert NODE_HEADER[-1] == RANK_HEADER[-1] == "straggler score"


def test_cells_are_in_the_units_their_headers_name():
    assert table_rows(NODE_COLUMNS, [NODE_ROW]) == [
        [
            "gpu-node003",
            "0,1",
            "4",
            "4",
            "500.4",
            "584.2",
            "2,095,634",
            "43.7",
            "2.0",
            "89.2",
            "2,396",
            "177.0",
            "162.66",
            "+0.000",
        ]
    ]
    assert table_rows(RANK_COLUMNS, [RANK_ROW]) == [
        [
            "gpu-node003",
            "13",
            "820",
            "571.0",
            "584.2",
            "1,836,458",
            "38.3",
            "2.0",
            "89.3",
            "599",
            "177.0",
            "+0.142",
        ]
    ]


def test_a_missing_or_nan_measurement_shows_as_a_dash():
    counts = {"node", "attempts", "ranks", "gpus", "rank", "steps"}  # always present
    for columns, row in ((NODE_COLUMNS, NODE_ROW), (RANK_COLUMNS, RANK_ROW)):
        for missing in (None, math.nan):
            blank = {k: v if k in counts else missing for k, v in row.items()}
            [cells] = table_rows(columns, [blank])
            for column, cell in zip(columns, cells, strict=True):
                assert (cell == "-") == (column.key not in counts), column.header
