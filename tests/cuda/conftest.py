"""Fixtures of the GPU tests (plain helpers: ``rng``, ``rel_err``, ``to_gpu``,
``close`` in tests/helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def debug(monkeypatch):
    """``CC2OPS_DEBUG=1``: every new GPU array is filled with NaN before a kernel
    writes it (``array.empty`` poisons it), and kernels compile with
    ``-lineinfo``."""
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
