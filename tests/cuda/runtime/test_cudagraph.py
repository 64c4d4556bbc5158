"""CUDA-graph capture and replay (``cc2ops.cuda.runtime.cudagraph``).

GPU tests: a captured sequence of kernels and cuBLAS calls replays with new
input data and gives the eager results; a captured training step (dropout
on and off) gives the same losses and parameters as the eager step over
several steps; deferred label checks still raise; a capture that would
synchronise fails cleanly and leaves the stream usable. CPU tests: the
refusals of :func:`capture_function` (host inputs, host outputs, updated
host shared variables) on host-only functions.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import cc2ops.cuda as cuda
from cc2ops.cuda.capture import capture_function
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.cudagraph import CudaGraph, GraphCaptureError
from cc2ops.testing.compare import rel_err
from cc2ops.testing.nets import StepConfig, build_step

#: The captured-step nets, without and with dropout.
CONFIGS = {
    "no-dropout": StepConfig("small", batch=16, width_mult=0.25, seed=5),
    "dropout": StepConfig(
        "imagenet", batch=16, crop=67, classes=10, width_mult=1 / 16, seed=5
    ),
}

gpu = pytest.mark.gpu


# --------------------------------------------------------------------------
# refusals (CPU)
# --------------------------------------------------------------------------


def test_capture_function_refuses_host_inputs():
    x = pt.vector("x")
    fn = pytensor.function([x], 2 * x, mode="FAST_COMPILE")
    with pytest.raises(TypeError, match="input 0 .* is a host variable"):
        capture_function(fn)


def test_capture_function_refuses_non_functions():
    with pytest.raises(TypeError, match="expected a compiled pytensor Function"):
        capture_function(lambda x: x)


def test_capture_function_checks_warmup():
    x = pt.vector("x")
    fn = pytensor.function([x], 2 * x, mode="FAST_COMPILE")
    with pytest.raises(ValueError, match="warmup must be >= 1, got 0"):
        capture_function(fn, warmup=0)


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


@gpu
def test_graph_replays_kernels_and_gemm_with_new_inputs():
    from cc2ops.cuda.libs import cublas as blas
    from cc2ops.cuda.ops.conv import ops as conv

    r = np.random.default_rng(0)
    x = array.to_gpu(r.standard_normal((4, 3, 9, 9)).astype(np.float32), 0)
    w = array.to_gpu(r.standard_normal((5, 3, 3, 3)).astype(np.float32), 0)
    a = array.to_gpu(r.standard_normal((32, 16)).astype(np.float32), 0)
    c = array.empty((32, 32), np.float32, 0)
    conv.filter_acts(x, w, padding=1, algorithm="im2col_knp_32m")  # warm-up
    blas.gemm(a, a, c, trans_b=True, device=0)
    graph = CudaGraph(0)

    def body():
        y = conv.filter_acts(x, w, padding=1, algorithm="im2col_knp_32m")
        blas.gemm(a, a, c, trans_b=True, device=0)
        return y

    y = graph.capture(body)
    assert graph.captured and graph.nodes >= 3
    for seed in (1, 2):
        rs = np.random.default_rng(seed)
        xn = rs.standard_normal((4, 3, 9, 9)).astype(np.float32)
        an = rs.standard_normal((32, 16)).astype(np.float32)
        array._copy_into_contiguous(array.to_gpu(xn, 0), x, 0)
        array._copy_into_contiguous(array.to_gpu(an, 0), a, 0)
        graph.replay()
        want = array.to_host(conv.filter_acts(x, w, padding=1,
                                              algorithm="im2col_knp_32m"))  # fmt: skip
        np.testing.assert_array_equal(array.to_host(y), want)
        np.testing.assert_allclose(array.to_host(c), an @ an.T, rtol=1e-4, atol=1e-4)
    graph.close()
    assert not graph.captured


@gpu
def test_capture_that_synchronises_fails_cleanly():
    x = array.to_gpu(np.arange(8, dtype=np.float32), 0)
    graph = CudaGraph(0)
    with pytest.raises(GraphCaptureError, match="cannot be captured"):
        graph.capture(lambda: array.to_host(x))
    assert not graph.captured
    # the stream works normally afterwards
    array.fill(x, 3.0, device=0)
    np.testing.assert_array_equal(array.to_host(x), np.full(8, 3.0, np.float32))


def _steps(fn, cfg, n, seed=0):
    r = np.random.default_rng(seed)
    losses = []
    for _ in range(n):
        x = r.standard_normal(cfg.image_shape).astype(np.float32)
        y = r.integers(0, cfg.classes, cfg.batch).astype(np.int32)
        loss, err = fn(array.to_gpu(x, 0), array.to_gpu(y, 0))
        losses.append(float(array.to_host(loss)))
        assert 0.0 <= float(array.to_host(err)) <= 1.0
    return losses


@gpu
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_captured_step_matches_the_eager_step(kind):
    cfg = CONFIGS[kind]
    params = cfg.init_params()
    kw = dict(gpu_params=True, gpu_inputs=True, gpu_outputs=True)
    eager = build_step(cfg, params, **kw)
    eager_fn = eager.function(cuda.mode())
    graphed = build_step(cfg, params, **kw)
    captured = capture_function(graphed.function(cuda.mode()), warmup=2)
    want = _steps(eager_fn, cfg, 6)
    got = _steps(captured, cfg, 6)
    assert captured.graph is not None and captured.graph.nodes > 20
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name, p in eager.params.items():
        g = graphed.params[name].get_value()
        assert rel_err(g, p.get_value()) < 1e-5, name
    captured.close()


@gpu
def test_captured_step_still_rejects_bad_labels():
    cfg = CONFIGS["no-dropout"]
    step = build_step(cfg, gpu_params=True, gpu_inputs=True, gpu_outputs=True)
    captured = capture_function(step.function(cuda.mode()), warmup=1)
    r = np.random.default_rng(0)
    x = r.standard_normal(cfg.image_shape).astype(np.float32)
    y = r.integers(0, cfg.classes, cfg.batch).astype(np.int32)
    captured(x, y)
    captured(x, y)  # captured and replayed
    y[3] = cfg.classes
    with pytest.raises(ValueError, match=r"labels must be in \[0, K\)"):
        captured(x, y)
    with pytest.raises(ValueError, match="captured with"):
        captured(x[:2], y[:2])
    captured.close()
