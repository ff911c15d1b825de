"""Data-sheet figures to the cluster format's units: bits vs bytes, one way vs both ways."""

import pytest
from hypothesis import given, strategies as st

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.units import parse_figure


class TestParseFigure:
    def test_infiniband_hdr_200_gbit_is_25_gbyte_each_way(self):
        assert parse_figure("200 Gb/s each way", "link") == 2.5e10

    def test_a_both_ways_total_is_halved(self):
        # A100's NVLink: 600 GB/s summed over both directions is 300 GB/s each way
        assert parse_figure("600 GB/s bidirectional", "link") == 3e11
        assert parse_figure("64 GB/s both ways", "link") == 3.2e10

    def test_bits_and_bytes_differ_by_eight(self):
        assert parse_figure("100 GB/s one-way", "link") == 8 * parse_figure("100 Gb/s one-way", "link")

    def test_thousands_commas_and_decimals(self):
        assert parse_figure("2,039 GB/s", "memory-bandwidth") == 2.039e12
        assert parse_figure("362.05 TFLOPS", "flops") == pytest.approx(3.6205e14, rel=1e-15)

    def test_binary_and_decimal_sizes(self):
        assert parse_figure("80 GiB", "bytes") == 80 * 2**30
        assert parse_figure("80 GB", "bytes") == 8e10

    def test_times(self):
        assert parse_figure("5 us", "seconds") == 5e-6
        assert parse_figure("60 us", "seconds") == 6e-5
        assert parse_figure("2 ms", "seconds") == 2e-3

    @pytest.mark.parametrize("text, kind, what", [
        ("200 Gb/s", "link", "must say its direction"),
        ("200 Gb/s sometimes", "link", "must say its direction"),
        ("900 GB/s each way", "memory-bandwidth", "has no direction"),
        ("312 TOPS", "flops", "expected FLOP/s"),
        ("80 GiB/s", "bytes", "expected a size"),
        ("fast", "link", "expected a number and a unit"),
        ("5 hours", "seconds", "expected a time"),
    ])
    def test_a_figure_of_the_wrong_shape_says_why(self, text, kind, what):
        with pytest.raises(InputError) as info:
            parse_figure(text, kind, "links[3].bandwidth")
        assert info.value.where == "links[3].bandwidth" and what in info.value.what

    @given(st.integers(1, 10**6), st.sampled_from(["k", "M", "G", "T"]))
    def test_each_way_is_half_of_bidirectional_for_any_figure(self, number, prefix):
        one = parse_figure(f"{number} {prefix}b/s each way", "link")
        assert parse_figure(f"{2 * number} {prefix}b/s bidirectional", "link") == one
