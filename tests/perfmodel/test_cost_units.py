"""`toolkit plan --cost PRICES.yaml` counts in the model's unit: samples (`--samples N`) for a
samples model, tokens (`--tokens N`) for a token model; the other flag is one line, exit 2."""

from __future__ import annotations

from toolkit.plan import main as plan

SAMPLES_MODEL = ["model=ts_transformer", "data=returns", "hardware=h100", "precision=bf16"]


def cost_lines(out: str) -> list[str]:
    return out[out.index("cost to train") :].splitlines()


def test_a_samples_models_cost_is_in_samples(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100: 2.5\n")
    assert plan(["--top", "1", "--cost", str(prices), "--samples", "2e9", *SAMPLES_MODEL]) == 0
    header, row = cost_lines(capsys.readouterr().out)[:2]
    assert header == "cost to train 2e+09 samples on 2 devices:"
    assert row.startswith("  h100: ") and " samples/s, " in row and "tokens" not in row

    assert plan(["--top", "1", "--cost", str(prices), "--tokens", "1e9", *SAMPLES_MODEL]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --tokens: this model counts samples; give --samples N"
    )


def test_a_token_models_cost_stays_in_tokens(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100: 2.5\n")
    assert plan(["--top", "1", "--cost", str(prices), "model=gpt_tiny", "hardware=h100"]) == 0
    header, row = cost_lines(capsys.readouterr().out)[:2]
    assert header.startswith("cost to train 1e+09 tokens on ")
    assert " tokens/s, " in row and "samples" not in row
