"""busbw/algbw arithmetic against values computed by hand from nccl-tests' definitions."""

import math

import pytest

from toolkit.collectives.busbw import algbw_gbps, bus_factor, busbw_gbps, layout, sweep_sizes


def test_all_reduce_on_8_ranks_moves_2_times_7_eighths_of_the_buffer():
    # 1 GiB in 10 ms: algbw = 1073741824 / 1e9 / 0.01 = 107.3741824 GB/s; x 2*7/8 = 1.75
    assert algbw_gbps(1 << 30, 0.01) == pytest.approx(107.3741824)
    assert busbw_gbps("all_reduce", 1 << 30, 0.01, 8) == pytest.approx(187.9048192)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all"])
def test_chunked_ops_use_n_minus_1_over_n(op):
    # 4 ranks: factor 3/4; 400 MB in 2 ms -> algbw 200 GB/s -> busbw 150 GB/s
    assert bus_factor(op, 4) == 0.75
    assert busbw_gbps(op, 400_000_000, 0.002, 4) == pytest.approx(150.0)


def test_broadcast_busbw_equals_algbw():
    assert busbw_gbps("broadcast", 1_000_000, 0.001, 16) == pytest.approx(1.0)


def test_two_ranks_all_reduce_factor_is_one():
    assert bus_factor("all_reduce", 2) == 1.0


def test_unknown_op_names_the_allowed_ones():
    with pytest.raises(ValueError, match="op=gather: unknown collective; allowed: all_reduce"):
        bus_factor("gather", 2)


def test_sweep_doubles_from_min_to_max_inclusive():
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(8, 100, 4) == [8, 32]
    assert len(sweep_sizes(8, 1 << 30, 2)) == 28  # 8 B .. 1 GiB, as in nccl-tests -b 8 -e 1G -f 2


def test_all_gather_size_is_the_gathered_output_in_multiples_of_4_elements_per_rank():
    # 1000 B of float32 = 250 elements over 3 ranks -> 80 per rank (multiple of 4) -> 240 total
    lay = layout("all_gather", 1000, 4, 3)
    assert (lay.chunk, lay.count, lay.size_bytes) == (80, 240, 960)


def test_all_reduce_size_is_the_buffer():
    lay = layout("all_reduce", 1000, 4, 3)
    assert (lay.count, lay.size_bytes) == (250, 1000)


def test_sizes_too_small_for_a_chunk_per_rank_are_skipped():
    assert layout("reduce_scatter", 8, 4, 2) is None  # 2 elements < 4 per rank x 2 ranks
    assert layout("all_reduce", 8, 4, 2).count == 2


def test_zero_time_gives_zero_bandwidth_not_a_crash():
    assert algbw_gbps(1024, 0.0) == 0.0 and not math.isnan(busbw_gbps("all_reduce", 1, 0.0, 2))
