"""Whole training steps on the GPU agree with the CPU (gpu marker).

The small convnet of ``benchmarks/step_net.py`` (32x32 images, two conv
layers with ReLU, cross-map norm and max pooling, an FC layer, softmax
cross-entropy, momentum SGD with weight decay) runs 20 steps in
``cc2ops.cuda.mode()`` with ``cc2ops.cuda.shared`` parameters and 20 steps
in the CPU mode ``cc2ops.mode`` with host parameters, from identical
initial values and minibatches. Losses must agree within float32 tolerance
at every step and the parameters at the end; with dropout on, the masks are
bit-identical by construction (one counter-based rule on both sides).
TF32 is off (the default).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import cc2ops
import cc2ops.cuda as cuda
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.step_net import build_step, init_params, small_config  # noqa: E402

pytestmark = pytest.mark.gpu

STEPS = 20


def batches(cfg, n, seed=0):
    r = np.random.default_rng(seed)
    shape = (cfg.batch, cfg.channels, cfg.image, cfg.image)
    for _ in range(n):
        x = r.standard_normal(shape).astype(cfg.dtype)
        y = r.integers(0, cfg.classes, cfg.batch).astype("int32")
        yield x, y


def run_steps(cfg, params, *, gpu, steps=STEPS):
    step = build_step(cfg, params, gpu_params=gpu)
    fn = step.function(cuda.mode() if gpu else cc2ops.mode)
    losses = []
    for x, y in batches(cfg, steps):
        loss, err = fn(x, y)
        losses.append(float(loss))
        assert 0.0 <= float(err) <= 1.0
    final = {n: np.asarray(p.get_value()) for n, p in step.params.items()}
    return fn, losses, final


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-dropout", "dropout"])
def test_twenty_sgd_steps_match_the_cpu(dropout, monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    cfg = small_config(dropout=dropout)
    params = init_params(cfg, seed=3)
    gpu_fn, gpu_losses, gpu_params = run_steps(cfg, params, gpu=True)
    _, cpu_losses, cpu_params = run_steps(cfg, params, gpu=False)
    # the compiled step really is a GPU graph
    nodes = gpu_fn.maker.fgraph.apply_nodes
    transfers = [n for n in nodes if isinstance(n.op, (GpuFromHost, HostFromGpu))]
    assert len(transfers) == 4, [str(n.op) for n in transfers]
    assert sum(isinstance(n.op, GpuOp) for n in nodes) > 20
    assert np.isfinite(gpu_losses).all()
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-3, atol=1e-5)
    assert gpu_losses[-1] < gpu_losses[0], gpu_losses  # it learns
    for name, want in cpu_params.items():
        got = gpu_params[name]
        assert got.shape == want.shape and np.isfinite(got).all(), name
        assert rel(got, want) < 5e-3, f"{name}: relative error {rel(got, want)}"


def test_parameters_stay_on_the_gpu_between_steps():
    cfg = small_config()
    step = build_step(cfg, gpu_params=True)
    fn = step.function(cuda.mode())
    for x, y in batches(cfg, 2):
        fn(x, y)
    for p in list(step.params.values()) + list(step.velocities.values()):
        assert p.is_uploaded, p.name
        assert hasattr(p.get_value(borrow=True, return_internal_type=True), "gpudata")


def test_step_sanitize():
    """Two steps of a tiny net: every structural/BLAS/softmax-loss kernel once."""
    cfg = small_config(batch=4, image=16, widths=(4, 8), fc=(16,), classes=5)
    params = init_params(cfg, seed=1)
    _, gpu_losses, _ = run_steps(cfg, params, gpu=True, steps=2)
    _, cpu_losses, _ = run_steps(cfg, params, gpu=False, steps=2)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4, atol=1e-6)
