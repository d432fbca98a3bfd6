"""The user's price table: a mapping of known hardware presets to numbers, one-line errors."""

from __future__ import annotations

import pytest

from toolkit.perfmodel.prices import read_prices


def test_a_price_table_reads_as_floats(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("h100: 3\na100: 1.8\n")
    assert read_prices(path) == {"h100": 3.0, "a100": 1.8}


@pytest.mark.parametrize(
    "text, message",
    [
        ("- h100\n", "expected a mapping"),
        ("tpu9: 1.0\n", "hardware presets ['tpu9'] unknown"),
        ("h100: cheap\n", "every price must be a number"),
    ],
)
def test_a_bad_price_table_is_one_line(tmp_path, text, message):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_prices(path)
