"""The relative error every test and benchmark compares results with.

One definition, so a benchmark's "agrees to 1e-4 before timing" and a test's
tolerance mean the same number: ``||got - want|| / ||want||`` (Frobenius norm
over all elements) computed in float64, or in complex128 when either side is
complex (a float64 cast would drop the imaginary part).

Notes
-----
``want`` is the reference: the error is relative to its norm, and to nothing
(the absolute error) when ``want`` is all zeros. Shapes must match exactly:
broadcasting would hide a wrong output shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rel_err"]


def rel_err(got: Any, want: Any) -> float:
    """``||got - want|| / ||want||`` in float64 (complex128 for complex inputs).

    Parameters
    ----------
    got, want : array_like
        The result and its reference, of one shape (any axis order, the same
        on both sides).

    Returns
    -------
    float
        The relative error; ``||got - want||`` when ``want`` is zero.

    Raises
    ------
    ValueError
        The shapes differ (the message names both).
    """
    complex_ = np.iscomplexobj(got) or np.iscomplexobj(want)
    dt = np.complex128 if complex_ else np.float64
    got = np.asarray(got, dtype=dt)
    want = np.asarray(want, dtype=dt)
    if got.shape != want.shape:
        raise ValueError(f"rel_err: shapes differ: got {got.shape}, want {want.shape}")
    num = float(np.linalg.norm(got - want))
    den = float(np.linalg.norm(want))
    return num / den if den else num
