"""cc2ops.testing.compare.rel_err: the one relative error of tests and benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

from cc2ops.testing.compare import rel_err


def test_relative_to_the_reference_in_float64():
    assert rel_err(np.array([3.0, 4.5]), np.array([3.0, 4.0])) == pytest.approx(0.1)
    # float32 results against a float64 reference: the float32 rounding counts
    third = np.float32(1) / np.float32(3)
    want = abs(float(third) - 1 / 3) / (1 / 3)
    assert rel_err(np.array([third]), np.array([1 / 3])) == pytest.approx(want)
    assert want > 0


def test_zero_reference_gives_the_absolute_error():
    assert rel_err(np.array([3.0, 4.0]), np.zeros(2)) == 5.0
    assert rel_err(np.zeros(3), np.zeros(3)) == 0.0


def test_complex_values_keep_their_imaginary_part():
    assert rel_err(np.array([1j]), np.array([0j + 1])) == pytest.approx(np.sqrt(2))


def test_shapes_must_match():
    with pytest.raises(ValueError, match=r"shapes differ: got \(2, 1\), want \(2,\)"):
        rel_err(np.zeros((2, 1)), np.zeros(2))
