"""The stopwatch adds each timed block's wall time to its phase, also when the block raises."""

import time

import pytest

from machina.logging.stopwatch import Stopwatch


def test_phases_sum_their_blocks_and_pop_starts_again():
    sw = Stopwatch()
    for _ in range(2):
        with sw.time("a"):
            time.sleep(0.02)
    with sw.time("b"):
        pass
    totals = sw.pop()
    assert set(totals) == {"a", "b"}
    assert 0.04 <= totals["a"] < 1.0
    assert 0.0 <= totals["b"] < totals["a"]
    assert sw.pop() == {}
    with sw.time("a"):
        pass
    assert sw.pop()["a"] < 0.02  # a fresh total, not added to the popped one


def test_a_block_that_raises_is_still_timed():
    sw = Stopwatch()
    with pytest.raises(KeyError), sw.time("failing"):
        time.sleep(0.01)
        raise KeyError("x")
    assert sw.pop()["failing"] >= 0.01
