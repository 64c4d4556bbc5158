"""Whole training steps on the GPU agree with the CPU (gpu marker).

The step of :mod:`cc2ops.testing.nets` (the trained step of the example) on
its CIFAR-10 "11pct" net at a quarter width (32x32 images, four convs,
cross-map norm, max pooling, softmax cross-entropy, momentum SGD with weight
decay) and, for dropout, its ImageNet net on 67x67 images at 1/16 width,
runs 20 steps in
``cc2ops.cuda.mode()`` with ``cc2ops.cuda.shared`` parameters and 20 steps
in the CPU mode ``cc2ops.mode`` with host parameters, from identical
initial values and minibatches. Losses must agree within float32 tolerance
at every step and the parameters at the end; with dropout on, the masks are
bit-identical by construction (one counter-based rule on both sides).
TF32 is off (the default).
"""

from __future__ import annotations

import numpy as np
import pytest

import cc2ops
import cc2ops.cuda as cuda
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu
from cc2ops.testing.compare import rel_err
from cc2ops.testing.nets import StepConfig, build_step

pytestmark = pytest.mark.gpu

STEPS = 20
#: The nets of the 20-step comparison, without and with dropout.
CONFIGS = {
    "no-dropout": StepConfig("small", batch=16, width_mult=0.25, seed=3),
    "dropout": StepConfig(
        "imagenet", batch=16, crop=67, classes=10, width_mult=1 / 16, seed=3
    ),
}


def batches(cfg, n, seed=0):
    r = np.random.default_rng(seed)
    for _ in range(n):
        x = r.standard_normal(cfg.image_shape).astype(np.float32)
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


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_twenty_sgd_steps_match_the_cpu(kind, debug):
    cfg = CONFIGS[kind]
    params = cfg.init_params()
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
        err = rel_err(got, want)
        assert err < 5e-3, f"{name}: relative error {err}"


def test_parameters_stay_on_the_gpu_between_steps():
    cfg = CONFIGS["no-dropout"]
    step = build_step(cfg, gpu_params=True)
    fn = step.function(cuda.mode())
    for x, y in batches(cfg, 2):
        fn(x, y)
    for p in list(step.params.values()) + list(step.velocities.values()):
        assert p.is_uploaded, p.name
        assert hasattr(p.get_value(borrow=True, return_internal_type=True), "gpudata")


def test_step_sanitize():
    """Two steps of a tiny net: every structural/BLAS/softmax-loss kernel once."""
    cfg = StepConfig("small", batch=4, crop=16, classes=5, width_mult=1 / 16, seed=1)
    params = cfg.init_params()
    _, gpu_losses, _ = run_steps(cfg, params, gpu=True, steps=2)
    _, cpu_losses, _ = run_steps(cfg, params, gpu=False, steps=2)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4, atol=1e-6)
