"""The CUDA runtime on a GPU: transfers, arrays, pools, shared variables, caches, exit.

Run on a machine with pycuda and a device (``gpu`` marker; skipped elsewhere
with the reason from ``cc2ops.cuda.unavailable_reason()``). Kernels are
compiled with nvcc into a temporary ``CC2OPS_CACHE_DIR``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from multiprocessing.pool import ThreadPool
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply

import cc2ops.cuda as cuda
from cc2ops.cuda.op import GpuOp, as_gpu_variable
from cc2ops.cuda.runtime import array as garray
from cc2ops.cuda.runtime import compile as ccompile
from cc2ops.cuda.runtime import device as cdevice
from cc2ops.cuda.type import CudaArrayType

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[3]
DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
SHAPES = [(), (0,), (1,), (3, 5, 7), (0, 3), (2, 1, 3), (257, 129)]
#: The transfers compiled and run as written (no cancelling of the pairs).
NO_CANCEL = ("cc2ops_transfer_cancel", "cc2ops_transfer_cancel_in_lift")


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    old = os.environ.get("CC2OPS_CACHE_DIR")
    path = tmp_path_factory.mktemp("kernels")
    os.environ["CC2OPS_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("CC2OPS_CACHE_DIR", None)
    else:
        os.environ["CC2OPS_CACHE_DIR"] = old


def sample(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    kind = np.dtype(dtype).kind
    if kind == "u":
        return rng.integers(0, 200, shape).astype(dtype)
    if kind == "i":
        return rng.integers(-100, 100, shape).astype(dtype)
    if kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
            dtype
        )
    return rng.standard_normal(shape).astype(dtype)


def run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=300,
    )


class GpuFull(GpuOp):
    """Test GPU op: an array like ``x`` filled with ``value`` (fill kernel)."""

    __props__ = ("value",)

    def __init__(self, *, value):
        self.value = float(value)

    def make_node(self, x):
        x = as_gpu_variable(x, op="GpuFull", role="x")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        (x,) = inputs
        device = self.device_of(node)
        outputs[0][0] = garray.full(x.shape, self.value, x.dtype, device)

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------


def test_device_properties():
    dev = cuda.get_device(0)
    assert cuda.get_device(0) is dev
    assert dev.label == 0 and dev.index == cdevice.physical_index(0)
    assert re.fullmatch(r"sm_\d{2,3}", dev.arch), dev.arch
    assert dev.arch == f"sm_{dev.compute_capability[0]}{dev.compute_capability[1]}"
    assert dev.multiprocessors > 0 and dev.name
    assert dev.max_shared_per_block_optin >= dev.max_shared_per_block >= 48 * 1024
    assert dev.context is not None and dev.stream is not None and dev.pool is not None


def test_context_push_pop_and_using():
    dev = cuda.get_device(0)
    dev.activate()
    depth = len(cdevice._active.stack)
    dev.activate()  # already current: no push
    assert len(cdevice._active.stack) == depth
    with dev.using() as same:
        assert same is dev and len(cdevice._active.stack) == depth + 1
    assert len(cdevice._active.stack) == depth
    dev.push()
    dev.pop()
    assert len(cdevice._active.stack) == depth
    # popping a device that is not on top is refused
    stranger = cdevice.Device(99, SimpleNamespace(index=42))
    with pytest.raises(RuntimeError, match="current cc2ops context is physical device"):
        stranger.pop()
    assert len(cdevice._active.stack) == depth


def test_set_device_map_refuses_to_move_a_used_label():
    cuda.get_device(0)
    saved = cdevice._explicit_map
    try:
        with pytest.raises(ValueError, match="device label 0 is already in use"):
            cuda.set_device_map({0: 7})
        assert cdevice.physical_index(0) == cuda.get_device(0).index
    finally:
        cdevice._explicit_map = saved


def test_virtual_devices_share_one_gpu_in_a_fresh_process():
    proc = run_python(
        """
        import numpy as np, pytensor
        import cc2ops.cuda as cuda
        from cc2ops.cuda.runtime import array as ga
        d0, d1 = cuda.get_device(0), cuda.get_device(1)
        assert d0.index == d1.index == 0, (d0, d1)
        assert d0.shares_physical(d1) and d0.context == d1.context
        assert d0.stream is d1.stream and d0.pool is d1.pool
        a = ga.to_gpu(np.arange(6, dtype="float32"), 0)
        t1 = cuda.CudaArrayType("float32", (None,), 1)
        assert t1.filter(a) is a
        x = cuda.CudaArrayType("float32", (None,), 0)("x")
        f = pytensor.function([x], cuda.gpu_to_gpu(x, 1),
                              mode=cuda.mode(0, devices=[0, 1]))
        out = f(a)
        assert ga.ptr(out) != ga.ptr(a)
        assert np.array_equal(ga.to_host(out), np.arange(6))
        print("OK")
        """,
        CC2OPS_DEVICE_MAP="0,0",
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


# --------------------------------------------------------------------------
# arrays and transfers
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype_and_shape(dtype):
    for shape in SHAPES:
        x = sample(dtype, shape)
        g = garray.to_gpu(x, 0)
        assert tuple(g.shape) == x.shape and np.dtype(g.dtype) == x.dtype
        assert (
            garray.is_c_contiguous(g)
            and garray.device_of(g) == cuda.get_device(0).index
        )
        if x.size == 0:
            assert garray.ptr(g) == 0
        back = garray.to_host(g)
        assert back.shape == x.shape and back.dtype == x.dtype, (dtype, shape)
        np.testing.assert_array_equal(back, x, err_msg=f"{dtype} {shape}")


@pytest.mark.parametrize("dtype", ["int8", "float16", "float32", "complex128"])
def test_round_trip_of_non_contiguous_host_arrays(dtype):
    base = sample(dtype, (6, 8, 10))
    for view in (
        base.T,
        base[::2, ::-1, 3:],
        base[:, 2, ::3],
        base[..., ::-2].transpose(1, 2, 0),
    ):
        back = garray.to_host(garray.to_gpu(view, 0))
        np.testing.assert_array_equal(back, view)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transfer_ops_in_compiled_functions(dtype):
    h = pt.tensor("h", dtype=dtype, shape=(None, None))
    up = pytensor.function([h], cuda.gpu_from_host(h, 0), mode=cuda.mode())
    x = CudaArrayType(dtype, (None, None), 0)("x")
    down = pytensor.function([x], cuda.host_from_gpu(x), mode=cuda.mode())
    for shape in [(0, 4), (1, 1), (5, 7)]:
        value = sample(dtype, shape)
        g = up(value)
        assert type(g).__name__ == "GPUArray" and tuple(g.shape) == shape
        out = down(g)
        assert isinstance(out, np.ndarray) and out.dtype == value.dtype
        np.testing.assert_array_equal(out, value, err_msg=f"{dtype} {shape}")
        # a non-contiguous view of a GPU value is a valid input too
        if value.size and value.shape[1] > 2:  # pycuda cannot slice empty arrays
            np.testing.assert_array_equal(down(g[:, ::2]), value[:, ::2])


def test_gpu_to_gpu_makes_a_distinct_contiguous_copy():
    x = CudaArrayType("float32", (None, None), 0)("x")
    mode = cuda.mode().excluding(*NO_CANCEL)
    f = pytensor.function([x], cuda.GpuToGpu(0, 0)(x), mode=mode)
    value = sample("float32", (6, 9))
    g = garray.to_gpu(value, 0)
    for arg, want in ((g, value), (g[::2, ::-3], value[::2, ::-3])):
        out = f(arg)
        assert garray.ptr(out) != garray.ptr(arg) and garray.is_c_contiguous(out)
        np.testing.assert_array_equal(garray.to_host(out), want)


def test_gpu_to_gpu_between_physical_devices():
    import pycuda.driver as drv

    if drv.Device.count() < 2 or cdevice.physical_index(1) == cdevice.physical_index(0):
        pytest.skip("needs two physical GPUs")
    x = CudaArrayType("float64", (None,), 0)("x")
    f = pytensor.function([x], cuda.gpu_to_gpu(x, 1), mode=cuda.mode(0, devices=[0, 1]))
    value = sample("float64", (1001,))
    out = f(garray.to_gpu(value, 0)[::3])
    assert garray.device_of(out) == cuda.get_device(1).index
    np.testing.assert_array_equal(garray.to_host(out), value[::3])


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "float16", "float32", "float64", "complex128"]
)
def test_strided_device_views_become_contiguous(dtype):
    base = sample(dtype, (7, 9, 11))
    g = garray.to_gpu(base, 0)
    assert garray.ascontiguous(g) is g
    views = [
        (lambda a: a[::2, 1:, ::3], lambda a: a[::2, 1:, ::3]),
        (lambda a: a[:, ::-1, :], lambda a: a[:, ::-1, :]),
        (lambda a: a.transpose((2, 0, 1)), lambda a: a.transpose(2, 0, 1)),
        (lambda a: a[3], lambda a: a[3]),
        (lambda a: a[:, 2], lambda a: a[:, 2]),
        (lambda a: a[1:2, ::-2, 5:6], lambda a: a[1:2, ::-2, 5:6]),
        (lambda a: a.T, lambda a: a.T),
    ]
    for on_gpu, on_host in views:
        view, want = on_gpu(g), on_host(base)
        c = garray.ascontiguous(view)
        assert garray.is_c_contiguous(c) and tuple(c.shape) == want.shape
        assert garray.is_c_contiguous(view) == want.flags.c_contiguous or want.size <= 1
        np.testing.assert_array_equal(garray.to_host(c), want)
        np.testing.assert_array_equal(garray.to_host(view), want)


def test_copy_zeros_full_fill():
    value = sample("float32", (5, 6))
    g = garray.to_gpu(value, 0)
    c = garray.copy(g)
    assert garray.ptr(c) != garray.ptr(g)
    np.testing.assert_array_equal(garray.to_host(c), value)
    for dtype in DTYPES:
        z = garray.zeros((3, 17), dtype, 0)
        np.testing.assert_array_equal(garray.to_host(z), np.zeros((3, 17), dtype))
    values = [
        ("int16", -3), ("uint8", 200), ("float16", 1.5), ("float64", -2.25),
        ("complex64", 1 - 2j), ("complex128", 3 + 4j), ("bool", True),
    ]  # fmt: skip
    for dtype, v in values:
        f = garray.full((4, 33), v, dtype, 0)
        np.testing.assert_array_equal(garray.to_host(f), np.full((4, 33), v, dtype))
    for dtype in ("float16", "float32", "float64", "complex128"):
        f = garray.fill(garray.empty((1001,), dtype, 0), np.nan)
        assert np.isnan(garray.to_host(f)).all()
    assert garray.fill(garray.empty((0,), "float32", 0), 1.0).size == 0
    with pytest.raises(ValueError, match="fill: the array must be C-contiguous"):
        garray.fill(g[:, ::2], 0.0)


def test_debug_mode_poisons_new_arrays(monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    assert np.isnan(garray.to_host(garray.empty((100,), "float32", 0))).all()
    assert np.isnan(garray.to_host(garray.empty((7,), "complex64", 0))).all()
    assert (garray.to_host(garray.empty((9,), "int32", 0)) == -1).all()
    assert (garray.to_host(garray.empty((9,), "uint8", 0)) == 255).all()


def test_memory_pool_reuses_freed_blocks():
    dev = cuda.get_device(0)
    nbytes = 3 * 1024 * 1024 + 17
    a = garray.empty((nbytes,), "uint8", 0)
    address = garray.ptr(a)
    held, active = dev.pool.held_blocks, dev.pool.active_blocks
    del a  # back to the pool, not to the driver
    assert dev.pool.held_blocks == held + 1
    assert dev.pool.active_blocks == active - 1
    b = garray.empty((nbytes,), "uint8", 0)
    assert garray.ptr(b) == address  # the same block: no new cuMemAlloc
    assert dev.pool.held_blocks == held and dev.pool.active_blocks == active
    raw = dev.alloc(1024)
    assert int(raw) != 0 and dev.pool.active_blocks == active + 1
    del raw, b


def test_launch_argument_errors():
    fn = ccompile.get_kernel("fill", 0, name="fill_u4", unit=4)
    g = garray.zeros((8,), "float32", 0)
    with pytest.raises(TypeError, match="argument 1 is a int"):
        ccompile.launch(fn, 1, 32, [g, 8, np.uint64(0), np.uint64(0), np.int64(1)], 0)
    with pytest.raises(ValueError, match="must have 1 to 1024 threads"):
        ccompile.launch(
            fn, 1, 2048, [g, np.int64(8), np.uint64(0), np.uint64(0), np.int64(1)], 0
        )
    # an empty grid launches nothing
    ccompile.launch(
        fn, 0, 32, [g, np.int64(8), np.uint64(1), np.uint64(1), np.int64(1)], 0
    )
    assert not garray.to_host(g).any()


# --------------------------------------------------------------------------
# the GPU mode: shared variables, inputs, outputs, constants
# --------------------------------------------------------------------------


def test_shared_variable_updates_stay_on_the_gpu():
    W = cuda.shared(np.ones((3, 4), "float32"), name="W")
    assert not W.is_uploaded
    update = cuda.gpu_from_host(cuda.host_from_gpu(W) * np.float32(0.5))
    f = pytensor.function([], [], updates=[(W, update)], mode=cuda.mode())
    assert W.is_uploaded  # uploaded when the function was linked
    assert isinstance(f.maker.fgraph.outputs[-1].type, CudaArrayType)
    for _ in range(4):
        f()
        assert (
            type(W.get_value(borrow=True, return_internal_type=True)).__name__
            == "GPUArray"
        )
    np.testing.assert_allclose(W.get_value(), np.full((3, 4), 0.5**4))
    # a second function sees the updated value
    read = pytensor.function([], cuda.host_from_gpu(W).sum(), mode=cuda.mode())
    np.testing.assert_allclose(read(), 12 * 0.5**4)
    # set_value after the upload keeps the variable on the GPU
    W.set_value(np.full((3, 4), 8, "float32"))
    assert W.is_uploaded
    f()
    np.testing.assert_allclose(W.get_value(), np.full((3, 4), 4.0))
    # return_internal_type without borrow is a device copy
    internal = W.get_value(borrow=True, return_internal_type=True)
    copied = W.get_value(return_internal_type=True)
    assert garray.ptr(copied) != garray.ptr(internal)


def test_pure_gpu_updates_need_no_host_transfer():
    W = cuda.shared(np.zeros(1000, "float64"))
    f = pytensor.function([], [], updates=[(W, GpuFull(value=3)(W))], mode=cuda.mode())
    kinds = {type(n.op).__name__ for n in f.maker.fgraph.apply_nodes}
    assert kinds == {"GpuFull"}, kinds
    f()
    np.testing.assert_array_equal(W.get_value(), np.full(1000, 3.0))


def test_host_update_expressions_are_uploaded():
    W = cuda.shared(np.zeros((2, 3), "float32"))
    x = pt.matrix("x", dtype="float32")
    f = pytensor.function(
        [x], [], updates=[(W, cuda.host_from_gpu(W) + x)], mode=cuda.mode()
    )
    one = np.ones((2, 3), "float32")
    f(one)
    f(one)
    np.testing.assert_array_equal(W.get_value(), 2 * one)
    assert W.is_uploaded


@pytest.mark.parametrize("linker", ["cvm", "py"])
def test_gpu_inputs_and_outputs(linker):
    x = CudaArrayType("float32", (None,), 0)("x")
    f = pytensor.function(
        [x], [x, cuda.host_from_gpu(x) * 2], mode=cuda.mode(linker=linker)
    )
    value = np.arange(5, dtype="float32")
    for arg in (value, garray.to_gpu(value, 0)):  # numpy inputs are uploaded by filter
        same, doubled = f(arg)
        assert type(same).__name__ == "GPUArray"
        np.testing.assert_array_equal(garray.to_host(same), value)
        np.testing.assert_array_equal(doubled, 2 * value)
    with pytest.raises(TypeError, match="has dtype float64, expected float32"):
        f(garray.to_gpu(value.astype("float64"), 0))


def test_outputs_that_alias_inputs_are_fresh_contiguous_copies():
    x = CudaArrayType("float32", (None, None), 0)("x")
    f = pytensor.function([x], [x, x], mode=cuda.mode())
    value = sample("float32", (8, 9))
    view = garray.to_gpu(value, 0)[1::2, ::-3]  # a view with gaps
    first, second = f(view)
    for out in (first, second):
        assert garray.is_c_contiguous(out) and garray.ptr(out) != garray.ptr(view)
        np.testing.assert_array_equal(garray.to_host(out), value[1::2, ::-3])
    assert garray.ptr(first) != garray.ptr(second)
    W = cuda.shared(value)
    read = pytensor.function([], W, mode=cuda.mode())
    out = read()
    assert garray.ptr(out) != garray.ptr(
        W.get_value(borrow=True, return_internal_type=True)
    )
    np.testing.assert_array_equal(garray.to_host(out), value)


def test_gpu_constants_are_uploaded_when_linked():
    k = CudaArrayType("float64", (None,), 0).filter_variable(np.array([1.0, 2.0, 3.0]))
    f = pytensor.function([], cuda.host_from_gpu(k) + 1, mode=cuda.mode())
    np.testing.assert_array_equal(f(), [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(f(), [2.0, 3.0, 4.0])


# --------------------------------------------------------------------------
# kernels: arch, memoisation, cache in a fresh process
# --------------------------------------------------------------------------


def test_kernels_are_compiled_for_the_device_and_memoised(kernel_cache):
    dev = cuda.get_device(0)
    consts = {"name": "fill_u2", "unit": 2}
    fn = ccompile.get_kernel("fill", 0, **consts)
    assert ccompile.get_kernel("fill", 0, **consts) is fn
    mod = ccompile.get_module("fill", 0, **consts)
    assert ccompile.get_module("fill", 0, **consts) is mod
    source = ccompile.render("fill", **consts)
    # the module may have come from memory, compiled into another worker's
    # or test's cache folder: this call fills kernel_cache's if so
    ccompile.compile_cubin(source, dev.arch)
    before = ccompile.compile_stats()["nvcc_runs"]
    cubin = ccompile.compile_cubin(source, dev.arch)  # a cache hit now
    assert ccompile.compile_stats()["nvcc_runs"] == before and cubin[:4] == b"\x7fELF"
    with pytest.raises(ValueError, match="has no kernel 'missing'"):
        ccompile.get_kernel("fill", 0, "missing", **consts)


def test_compile_cache_hit_in_a_fresh_process(tmp_path):
    arch = cuda.get_device(0).arch
    variants = [v for v in ccompile.all_variants() if v[0] in ("copy", "fill")]

    def build(item):
        family, consts = item
        ccompile.compile_cubin(ccompile.render(family, **consts), arch)

    old = os.environ["CC2OPS_CACHE_DIR"]
    os.environ["CC2OPS_CACHE_DIR"] = str(tmp_path)
    try:
        with ThreadPool(2) as pool:
            pool.map(build, variants)
    finally:
        os.environ["CC2OPS_CACHE_DIR"] = old
    proc = run_python(
        """
        import json
        import numpy as np
        from cc2ops.cuda.runtime import array as ga
        from cc2ops.cuda.runtime.compile import compile_stats
        value = np.arange(60, dtype="float32").reshape(3, 4, 5)
        g = ga.to_gpu(value, 0)
        ok = np.array_equal(ga.to_host(g[:, ::2, ::-1]), value[:, ::2, ::-1])
        ok &= bool((ga.to_host(ga.full((9,), 7, "int16", 0)) == 7).all())
        print(json.dumps(dict(compile_stats(), ok=bool(ok))))
        """,
        CC2OPS_CACHE_DIR=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["ok"] and stats["nvcc_runs"] == 0 and stats["cache_hits"] >= 2, stats


# --------------------------------------------------------------------------
# interpreter exit
# --------------------------------------------------------------------------

NOISE = ("PyCUDA", "context stack", "Traceback", "Segmentation", "abort", "cuMemFree")


@pytest.mark.parametrize("explicit_shutdown", [False, True])
def test_clean_interpreter_exit(explicit_shutdown):
    proc = run_python(
        f"""
        import numpy as np, pytensor
        import cc2ops.cuda as cuda
        from cc2ops.cuda.runtime import array as ga
        from cc2ops.cuda.libs import cublas as blas
        from cc2ops.cuda.runtime.device import shutdown
        keep = ga.to_gpu(np.ones((64, 64), "float32"), 0)
        view = keep[::2, 1:]
        contiguous = ga.ascontiguous(view)
        W = cuda.shared(np.zeros(10, "float32"))
        f = pytensor.function([], [], updates=[(W, cuda.gpu_from_host(
            cuda.host_from_gpu(W) + 1))], mode=cuda.mode())
        f()
        product = blas.gemm(keep, keep, device=0)
        assert float(ga.to_host(product)[0, 0]) == 64.0
        if {explicit_shutdown!r}:
            shutdown()
            del view, contiguous  # freed after the shutdown
        print("DONE")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "DONE" in proc.stdout
    noisy = [word for word in NOISE if word in proc.stderr]
    assert not noisy, proc.stderr


@pytest.mark.parametrize("release", [True, False])
def test_a_thread_that_used_a_device_ends_cleanly_after_release_thread(release):
    """pycuda aborts the process when a thread ends with a context on its stack
    (the GPU input pipeline's loader thread did); ``release_thread`` pops what
    cc2ops pushed on the thread. Without it the process aborts, which is why
    every such thread calls it (this half shows the hazard is real)."""
    proc = run_python(
        f"""
        import threading
        import numpy as np
        from cc2ops.cuda.runtime import array, device

        def work():
            try:
                device.get_device(0).activate()
                x = array.to_gpu(np.arange(6, dtype=np.float32), 0)
                assert array.to_host(x).sum() == 15
                # a pooled array must go before the context does: pycuda's
                # pool asks for the current context when it takes a block back
                del x
            finally:
                if {release}:
                    device.release_thread()
                    device.release_thread()  # a second call is a no-op

        # the device is made on the main thread, as the example's loader does
        # (its pool and stream belong to the thread that makes it)
        device.get_device(0).activate()
        t = threading.Thread(target=work)
        t.start()
        t.join()
        print("thread done")
        """
    )
    if release:
        assert proc.returncode == 0, proc.stderr
        assert "thread done" in proc.stdout
        assert "context stack was not empty" not in proc.stderr
    else:
        assert proc.returncode != 0
        assert "context stack was not empty" in proc.stderr
