"""The low-bit optimizer benchmark measures every name against adamw, with real state sizes."""

from toolkit.bench.lowbit import run


def test_the_benchmark_prints_state_bytes_and_step_times_against_adamw(capsys):
    run("gpt_tiny", rounds=1, steps=1, compile_step=False)
    rows = {
        line.split()[0]: line.split()[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("adamw")
    }
    assert set(rows) == {"adamw", "adamw8bit", "adamw_lowmem"}
    assert rows["adamw"][0] == "8.000" and rows["adamw"][-1] == "1.00x"
    measured = {name: float(cells[0]) for name, cells in rows.items()}
    # gpt_tiny's small tensors stay fp32: more than the table, much less than adamw
    assert 2.03 < measured["adamw8bit"] < 8.0
    assert 1.06 < measured["adamw_lowmem"] < measured["adamw8bit"]
