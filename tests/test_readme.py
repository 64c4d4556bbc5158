"""The README's worked example runs as written and trains."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_worked_example_runs_and_updates_the_parameters():
    blocks = _python_blocks()
    assert blocks, "README.md has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    step, images, labels = namespace["step"], namespace["images"], namespace["labels"]
    w1 = namespace["w1"]
    before = w1.get_value().copy()
    loss0, err0 = step(images, labels)
    assert loss0.dtype == np.float32 and np.isfinite(loss0)
    assert 0.0 <= float(err0) <= 1.0
    assert not np.array_equal(before, w1.get_value()), "the update did not run"
    for _ in range(30):
        loss, _ = step(images, labels)
    assert float(loss) < float(loss0), (float(loss0), float(loss))
