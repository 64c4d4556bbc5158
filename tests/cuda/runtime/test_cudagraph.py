"""CUDA-graph capture and replay (``cc2ops.cuda.runtime.cudagraph``).

GPU tests: a captured sequence of kernels and cuBLAS calls replays with new
input data and gives the eager results; a captured training step (dropout
on and off) gives the same losses and parameters as the eager step over
several steps; deferred label checks still raise; a capture that would
synchronise fails cleanly and leaves the stream usable; cuda-bindings drives
pycuda's stream in pycuda's context. CPU tests: the refusals of
:func:`capture_function` (host inputs, host outputs, updated host shared
variables) on host-only functions; the driver calls (order, arguments, error
names, clean-up) against a fake ``cuda.bindings.driver`` with the bindings'
return conventions, and the names cudagraph uses in the real bindings.
"""

from __future__ import annotations

import enum
import sys
from types import SimpleNamespace

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
# the driver calls, against a fake cuda.bindings.driver (CPU)
# --------------------------------------------------------------------------


class _Handle:
    """A cuda-bindings handle (CUstream, CUgraph, ...): an int in a box."""

    def __init__(self, value=0):
        self.value = int(value)

    def __int__(self):
        return self.value


class FakeDriver:
    """What cudagraph uses of ``cuda.bindings.driver``, with its conventions:
    every call returns a tuple ``(CUresult, outputs...)``, outputs ``None`` on
    failure; handles are objects that convert to int."""

    CUstream = CUgraph = CUgraphExec = _Handle

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_VALUE = 1
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

    class CUstreamCaptureMode(enum.IntEnum):
        CU_STREAM_CAPTURE_MODE_GLOBAL = 0
        CU_STREAM_CAPTURE_MODE_RELAXED = 2

    class CUstreamCaptureStatus(enum.IntEnum):
        CU_STREAM_CAPTURE_STATUS_NONE = 0
        CU_STREAM_CAPTURE_STATUS_ACTIVE = 1

    def __init__(self):
        self.calls = []
        self.capturing = False
        self.end_status = 0
        self.launch_status = 0
        self.live = set()

    def _log(self, name, *args):
        self.calls.append((name, *(int(a) for a in args)))

    def cuStreamBeginCapture(self, stream, mode):
        self._log("begin", stream, mode)
        self.capturing = True
        return (self.CUresult(0),)

    def cuStreamEndCapture(self, stream):
        self._log("end", stream)
        self.capturing = False
        if self.end_status:
            return (self.CUresult(self.end_status), None)
        self.live.add(0x6A)
        return (self.CUresult(0), _Handle(0x6A))

    def cuStreamIsCapturing(self, stream):
        self._log("is_capturing", stream)
        return (self.CUresult(0), self.CUstreamCaptureStatus(int(self.capturing)))

    def cuGraphGetNodes(self, graph, numNodes=0):
        self._log("get_nodes", graph, numNodes)
        return (self.CUresult(0), [], 5)

    def cuGraphInstantiate(self, graph, flags):
        self._log("instantiate", graph, flags)
        self.live.add(0xE0)
        return (self.CUresult(0), _Handle(0xE0))

    def cuGraphLaunch(self, exe, stream):
        self._log("launch", exe, stream)
        return (self.CUresult(self.launch_status),)

    def cuGraphExecDestroy(self, exe):
        self._log("exec_destroy", exe)
        self.live.discard(int(exe))
        return (self.CUresult(0),)

    def cuGraphDestroy(self, graph):
        self._log("destroy", graph)
        self.live.discard(int(graph))
        return (self.CUresult(0),)

    def cuGetErrorName(self, status):
        return (self.CUresult(0), b"CUDA_ERROR_SOMETHING_NEW")


class FakeDevice:
    index = 3
    label = 0

    def __init__(self):
        self.stream = SimpleNamespace(handle=0x5E)
        self.events = []

    def synchronize(self):
        self.events.append("sync")

    def activate(self):
        self.events.append("activate")


@pytest.fixture
def fake_driver(monkeypatch):
    from cc2ops.cuda.runtime import cudagraph, device, libraries

    drv = FakeDriver()
    dev = FakeDevice()
    monkeypatch.setattr(libraries, "_modules", {"cuda.bindings.driver": drv})
    monkeypatch.setattr(device, "get_device", lambda label: dev)
    monkeypatch.setattr(device, "physical_index", lambda label: dev.index)
    monkeypatch.setattr(cudagraph, "_active", {})
    return drv, dev


def test_capture_and_replay_call_the_driver_in_order(fake_driver):
    from cc2ops.cuda.runtime import cudagraph

    drv, dev = fake_driver
    graph = CudaGraph(0)
    seen = {}

    def body():
        seen["capturing"] = cudagraph.capturing(0)
        seen["stream"] = cudagraph._stream_is_capturing(dev)
        assert cudagraph.defer_check(0, lambda: seen.setdefault("checked", True))
        return "result"

    assert graph.capture(body) == "result"
    assert seen["capturing"] and seen["stream"]
    assert not cudagraph.capturing(0)
    assert graph.captured and graph.nodes == 5
    relaxed = int(drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    assert drv.calls == [
        ("begin", 0x5E, relaxed),
        ("is_capturing", 0x5E),
        ("end", 0x5E),
        ("get_nodes", 0x6A, 0),
        ("instantiate", 0x6A, 0),
    ]
    drv.calls.clear()
    graph.replay()
    assert drv.calls == [("launch", 0xE0, 0x5E)]
    assert seen["checked"] and dev.events[-1] == "sync"  # checks wait first
    graph.close()
    assert not graph.captured and drv.live == set()
    graph.close()  # idempotent


def test_invalidated_capture_is_a_named_error_and_leaves_nothing(fake_driver):
    from cc2ops.cuda.runtime import cudagraph

    drv, _ = fake_driver
    drv.end_status = 901
    graph = CudaGraph(0)
    with pytest.raises(
        GraphCaptureError,
        match="cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    ):
        graph.capture(lambda: None)
    assert not graph.captured and not cudagraph._active
    # a call that raised while capturing: its error, and the driver's name
    with pytest.raises(GraphCaptureError, match=r"raised ValueError: no \(CUDA_ERROR"):
        graph.capture(lambda: (_ for _ in ()).throw(ValueError("no")))
    assert not cudagraph._active and drv.live == set()


def test_replay_failure_names_the_driver_error(fake_driver):
    drv, _ = fake_driver
    graph = CudaGraph(0)
    graph.capture(lambda: None)
    drv.launch_status = 1
    with pytest.raises(
        GraphCaptureError,
        match="cudagraph: cuGraphLaunch failed: CUDA_ERROR_INVALID_VALUE",
    ):
        graph.replay()
    from cc2ops.cuda.runtime.cudagraph import _error_name

    # a code the bindings do not know: the driver names it
    assert _error_name(12345) == "CUDA_ERROR_SOMETHING_NEW"
    graph.close()


def test_capture_without_cuda_bindings_names_the_package(monkeypatch):
    from cc2ops.cuda.runtime import device, libraries

    monkeypatch.setattr(libraries, "_modules", {})
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    monkeypatch.setattr(device, "get_device", lambda label: FakeDevice())
    graph = CudaGraph(0)
    with pytest.raises(GraphCaptureError, match="pip install cuda-bindings"):
        graph.capture(lambda: None)


def test_the_real_bindings_have_what_cudagraph_calls():
    """cuda-bindings' names, enums and handle types as cudagraph uses them
    (no driver needed: nothing is called)."""
    drv = pytest.importorskip("cuda.bindings.driver")
    from cc2ops.cuda.runtime import libraries
    from cc2ops.cuda.runtime.cudagraph import _error_name

    for name in (
        "cuStreamBeginCapture",
        "cuStreamEndCapture",
        "cuStreamIsCapturing",
        "cuGraphGetNodes",
        "cuGraphInstantiate",
        "cuGraphLaunch",
        "cuGraphExecDestroy",
        "cuGraphDestroy",
        "cuGetErrorName",
    ):
        assert callable(getattr(drv, name)), name
    assert "flags" in drv.cuGraphInstantiate.__doc__.splitlines()[0]
    assert "numNodes" in drv.cuGraphGetNodes.__doc__.splitlines()[0]
    assert int(drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED) == 2
    assert int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE) == 0
    assert int(drv.CUstream(0x5E)) == 0x5E and int(drv.CUgraph()) == 0
    libraries._modules.pop("cuda.bindings.driver", None)
    assert _error_name(901) == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
    assert _error_name(0) == "CUDA_SUCCESS"


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


@gpu
def test_cuda_bindings_capture_pycudas_stream_in_pycudas_context():
    """cuda-bindings' driver calls work on pycuda's stream in pycuda's primary
    context: the context current for the bindings owns pycuda's allocations,
    the stream reports capturing only inside the capture, and a replay redoes
    pycuda's own kernel launches and copies with the new data."""
    from cuda.bindings import driver as drv

    from cc2ops.cuda.runtime import cudagraph
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    src = array.to_gpu(np.arange(256, dtype=np.float32), 0)
    dst = array.empty((256,), np.float32, 0)
    array.fill(dst, 1.0, device=0)  # compiles the fill kernel before capturing
    with dev.using():
        err, ctx = drv.cuCtxGetCurrent()
        assert int(err) == 0 and int(ctx) != 0
        err, owner = drv.cuPointerGetAttribute(
            drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, array.ptr(src)
        )
        assert int(err) == 0 and int(owner) == int(ctx)
    inside = []

    def body():
        inside.append(cudagraph._stream_is_capturing(dev))
        array.fill(dst, 0.0, device=0)
        array._copy_into_contiguous(src, dst, 0)

    graph = CudaGraph(0)
    graph.capture(body)
    assert inside == [True] and not cudagraph._stream_is_capturing(dev)
    assert graph.nodes >= 2
    np.testing.assert_array_equal(array.to_host(dst), np.ones(256, np.float32))
    new = array.to_gpu(np.full(256, 7.0, np.float32), 0)
    array._copy_into_contiguous(new, src, 0)
    graph.replay()
    np.testing.assert_array_equal(array.to_host(dst), np.full(256, 7.0, np.float32))
    graph.close()
    assert not cudagraph._stream_is_capturing(dev)


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
