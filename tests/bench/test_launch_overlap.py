"""The launch-overlap probe's analysis (benchmarks/probes/launch_overlap.py) on made-up kernel intervals; no GPU."""

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("probes/launch_overlap.py")


def test_gaps_durations_and_overlap(probe):
    # three kernels of 5 us: the second starts 1 us before the first ends, the third 2 us after the second
    s = probe.chain_summary([(10.0, 15.0), (24.0, 29.0), (14.0, 19.0)])  # any order
    assert s["calls"] == 3 and s["median_duration_us"] == 5.0
    assert s["median_gap_us"] == 2.0 and s["overlapping"] == 0.5  # gaps -1 and 5 us
    assert s["per_call_us"] == pytest.approx(19.0 / 3)


def test_a_chain_needs_two_kernels(probe):
    with pytest.raises(ValueError, match="at least two kernels"):
        probe.chain_summary([(0.0, 1.0)])
