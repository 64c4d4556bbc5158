"""Test configuration: ``gpu`` tests skip cleanly without pycuda and a device."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for `from helpers import ...`


def _gpu_reason() -> str | None:
    try:
        from cc2ops import cuda
    except ImportError as e:  # pragma: no cover - cc2ops.cuda always imports
        return f"cc2ops.cuda does not import: {e}"
    return cuda.unavailable_reason()


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {reason}")
    for it in gpu_items:
        it.add_marker(skip)
