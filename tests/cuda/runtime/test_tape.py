"""Launch tapes (:mod:`cc2ops.cuda.runtime.tape`): a node's device work recorded
once and replayed with new pointers.

CPU tests drive :class:`NodeTapes` the way a GPU op's thunk does, with fake
arrays, allocations and kernels, and check what a replay queues: new input and
temporary addresses substituted at the recorded offsets, constants kept,
outputs built over the right buffers; that a tape needs two consecutive equal
recordings (a per-call seed never gets one); that refusals (an upload, a
pointer outside the node's buffers, a host output) keep the node on
``perform``; what the key distinguishes; and how cuBLAS-style calls classify
their integer arguments. GPU tests compile real steps and compare the taped
calls with the same function run with tapes off, call after call, with new
input buffers each time.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cc2ops.cuda.runtime import tape
from cc2ops.cuda.runtime.tape import MAX_RECORDINGS, NodeTapes

gpu = pytest.mark.gpu


# --------------------------------------------------------------------------
# CPU: fakes
# --------------------------------------------------------------------------

_addresses = itertools.count(1 << 40, 1 << 20)


class FakeAlloc:
    """A pool allocation: an address (``int()``) that reports itself like
    ``PoolAllocator.__call__`` does."""

    def __init__(self, nbytes):
        self.address = next(_addresses)
        self.nbytes = nbytes
        tape.note_alloc(self, nbytes)

    def __int__(self):
        return self.address


def allocator(nbytes):
    return FakeAlloc(nbytes)


class FakeArray:
    """The attributes of a pycuda GPUArray the tapes use."""

    def __init__(self, shape, dtype=np.float32, gpudata=None, strides=None, base=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        item = self.dtype.itemsize
        if strides is None:
            strides, acc = [], item
            for n in reversed(self.shape):
                strides.append(acc)
                acc *= n
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.allocator = allocator
        if gpudata is None and self.size:
            gpudata = allocator(self.size * item)
        self.gpudata = gpudata
        self.base = base


FIELDS = frozenset(vars(FakeArray((1,))))


def ptr(a):
    return int(a.gpudata)


class FakeKernel:
    def __init__(self, name, log):
        self._cc2ops_name = name
        self.log = log
        self.texrefs = []

    def _launch_kernel(self, grid, block, buf, shared, stream):
        self.log.append((self._cc2ops_name, grid, block, buf, shared, stream))


def pack(fmt, *values):
    return (fmt, tuple(int(v) if not isinstance(v, float) else v for v in values))


def launch(fn, args, grid=(4, 1, 1), block=(128, 1, 1), stream="s"):
    """What compile.launch reports: GPU arrays as uintp pointers."""
    values = [ptr(a) if isinstance(a, FakeArray) else a for a in args]
    pointers = [i for i, a in enumerate(args) if isinstance(a, FakeArray)]
    fmt = "".join(
        "P" if isinstance(a, FakeArray) else np.dtype(type(a)).char for a in args
    )
    # the real launcher queues the kernel, then reports it
    fn._launch_kernel(grid, block, pack(fmt, *values), 0, stream)
    tape.note_launch(fn, grid, block, 0, stream, values, pointers, fmt)


class Node:
    """A fake GPU node driven like GpuOp's thunk drives one."""

    def __init__(self, perform, gpu_mask, tf32=lambda: False):
        self.perform = perform
        self.tapes = NodeTapes(gpu_mask, allocator, lambda: None, pack, FIELDS, tf32)
        self.performed = 0

    def __call__(self, *values):
        cells = [[None]]
        key = self.tapes.key(values)
        t = self.tapes.get(key) if key is not None else None
        if t is not None:
            t.play(values, cells)
            return cells[0][0]
        if key is None or not self.tapes.wants_recording(key):
            self.performed += 1
            cells[0][0] = self.perform(*values)
            return cells[0][0]
        rec = self.tapes.start(values)
        out = None
        try:
            out = self.perform(*values)
            self.performed += 1
        finally:
            self.tapes.stop(rec, key, None if out is None else [out])
        return out


def scale_node(log):
    """y = a * x through a temporary: a copy kernel into it, then a scale kernel."""
    copy_k, scale_k = FakeKernel("copy", log), FakeKernel("scale", log)

    def perform(x, a):
        tmp = FakeArray(x.shape)
        launch(copy_k, [x, tmp, np.int64(x.size)])
        out = FakeArray(x.shape)
        launch(scale_k, [tmp, out, np.float32(a), np.int64(x.size)])
        return out

    return Node(perform, [True, False])


# --------------------------------------------------------------------------
# CPU: recording and replaying
# --------------------------------------------------------------------------


def test_two_equal_recordings_make_a_tape_that_replays_with_new_pointers():
    log = []
    node = scale_node(log)
    for _ in range(2):
        node(FakeArray((8, 4)), np.float32(2.0))
    assert node.performed == 2
    (t,) = node.tapes.tapes.values()
    log.clear()
    x = FakeArray((8, 4))
    out = node(x, np.float32(2.0))
    assert node.performed == 2, "the third call is replayed, not performed"
    assert t.plays == 1
    (copy_call, scale_call) = log
    assert copy_call[0] == "copy" and scale_call[0] == "scale"
    fmt, (src, tmp, n) = copy_call[3]
    assert fmt == "PP" + np.dtype(np.int64).char and src == ptr(x) and n == 32
    fmt, (tmp2, dst, a, n2) = scale_call[3]
    assert tmp2 == tmp, "the temporary is the same buffer in both kernels"
    assert tmp not in (ptr(x), ptr(out)), "a new temporary was allocated"
    assert dst == ptr(out) and a == 2.0 and n2 == 32
    assert isinstance(out, FakeArray) and out.shape == (8, 4)
    assert isinstance(out.gpudata, FakeAlloc), "the output owns its new buffer"
    assert out.strides == x.strides and out.dtype == np.float32


def test_replay_keeps_offsets_into_inputs_and_builds_views():
    log = []
    k = FakeKernel("tail", log)

    def perform(x):
        # a kernel on the second row; the output is a view of x's third row
        item = x.dtype.itemsize
        row = FakeArray((4,), gpudata=ptr(x) + 4 * item, base=x)
        launch(k, [row, np.int32(4)])
        return FakeArray((4,), gpudata=ptr(x) + 8 * item, base=x)

    node = Node(perform, [True])
    node(FakeArray((3, 4)))
    node(FakeArray((3, 4)))
    log.clear()
    x = FakeArray((3, 4))
    out = node(x)
    assert log[0][3][1][0] == ptr(x) + 16
    assert out.gpudata == ptr(x) + 32 and out.base is x


def test_an_input_passed_through_is_the_same_object():
    node = Node(lambda x: x, [True])
    node(FakeArray((2,)))
    node(FakeArray((2,)))
    x = FakeArray((2,))
    assert node(x) is x
    assert node.tapes.tapes, "a pass-through (no device work) is taped too"


def test_a_per_call_seed_never_makes_a_tape():
    log = []
    k = FakeKernel("dropout", log)
    seeds = itertools.count(12345)

    def perform(x):
        out = FakeArray(x.shape)
        launch(k, [x, out, np.uint64(next(seeds))])
        return out

    node = Node(perform, [True])
    x = FakeArray((4,))
    for _ in range(MAX_RECORDINGS + 3):
        node(x)
    assert not node.tapes.tapes
    assert node.performed == MAX_RECORDINGS + 3
    assert node.tapes.last_refusal == "two consecutive calls queued different work"
    assert not node.tapes.wants_recording(node.tapes.key([x]))


def test_work_that_settles_after_the_first_call_is_taped():
    """An autotuner's first call differs; the next two agree."""
    log = []
    tuning, tuned = FakeKernel("tuning", log), FakeKernel("tuned", log)
    calls = itertools.count()

    def perform(x):
        out = FakeArray(x.shape)
        if next(calls) == 0:
            launch(tuning, [x, out])
        launch(tuned, [x, out])
        return out

    node = Node(perform, [True])
    for _ in range(4):
        node(FakeArray((4,)))
    assert node.performed == 3 and len(node.tapes.tapes) == 1


@pytest.mark.parametrize(
    "where, reason",
    [
        ("refuse", "a read-back to the host"),
        ("outside", "outside the node's inputs and temporaries"),
        ("host_output", "output 0 is a ndarray, not a GPU array"),
    ],
)
def test_refused_recordings_keep_the_node_on_perform(where, reason):
    log = []
    k = FakeKernel("k", log)
    kept = FakeArray((4,))  # a buffer from an earlier call

    def perform(x):
        out = FakeArray(x.shape)
        if where == "refuse":
            tape.refuse("a read-back to the host")
        launch(k, [x, kept if where == "outside" else out])
        return np.zeros(4) if where == "host_output" else out

    node = Node(perform, [True])
    for _ in range(MAX_RECORDINGS + 1):
        node(FakeArray((4,)))
    assert not node.tapes.tapes
    assert node.performed == MAX_RECORDINGS + 1
    assert reason in node.tapes.last_refusal


def test_recording_stops_when_perform_raises():
    def perform(x):
        raise ValueError("GpuThing: bad input")

    node = Node(perform, [True])
    with pytest.raises(ValueError, match="bad input"):
        node(FakeArray((2,)))
    assert tape.recorder() is None, "the recorder is cleared after an error"


def test_unused_temporaries_are_not_allocated_again():
    log = []
    k = FakeKernel("k", log)

    def perform(x):
        FakeArray((1024,))  # a lazily created workspace nothing launches with
        out = FakeArray(x.shape)
        launch(k, [x, out])
        return out

    node = Node(perform, [True])
    node(FakeArray((4,)))
    node(FakeArray((4,)))
    (t,) = node.tapes.tapes.values()
    assert t.temp_sizes == (16,)


def test_library_calls_classify_pointers_host_scalars_and_constants():
    calls = []

    def library(name, *args):
        calls.append((name, args))

    def perform(x):
        out = FakeArray(x.shape)
        alpha = np.array(1.5, np.float32)
        tape.note_host_scalar(alpha)
        args = (0x5555_0000_1000, 7, alpha.ctypes.data, ptr(x), ptr(out), 128)
        library("sgemm", *args)
        tape.note_library(library, "sgemm", args)
        return out

    node = Node(perform, [True])
    node(FakeArray((4,)))
    node(FakeArray((4,)))
    calls.clear()
    x = FakeArray((4,))
    out = node(x)
    ((name, (handle, seven, alpha_p, px, pout, n)),) = calls
    assert name == "sgemm" and handle == 0x5555_0000_1000 and seven == 7 and n == 128
    assert px == ptr(x) and pout == ptr(out)
    (t,) = node.tapes.tapes.values()
    assert alpha_p == t.host_copies[0].ctypes.data and t.host_copies[0] == 1.5


def test_noted_host_calls_are_repeated_with_arrays_over_the_new_buffers():
    """A deferred check (the softmax label flag) is a host call the replay
    makes again, with the flag and labels of the new call."""
    calls = []
    k = FakeKernel("k", [])
    kept = FakeArray((1,), np.uint32)  # a buffer from an earlier call

    def check(flag, labels, op, classes):
        calls.append((flag, labels, op, classes))

    def perform(x, outside=False):
        flag = FakeArray((1,), np.uint32)
        out = FakeArray(x.shape)
        launch(k, [x, out, flag])
        tape.note_call(check, (kept if outside else flag, x, "GpuThing", 7))
        check(flag, x, "GpuThing", 7)
        return out

    node = Node(perform, [True])
    node(FakeArray((4,), np.int32))
    node(FakeArray((4,), np.int32))
    (t,) = node.tapes.tapes.values()
    calls.clear()
    x = FakeArray((4,), np.int32)
    node(x)
    assert node.performed == 2
    ((flag, labels, op, classes),) = calls
    assert (op, classes) == ("GpuThing", 7)
    assert labels.gpudata == ptr(x) and labels.base is x and labels.shape == (4,)
    assert labels.dtype == np.int32 and labels.strides == x.strides
    assert flag.shape == (1,) and flag.dtype == np.uint32
    assert isinstance(flag.base, FakeAlloc), "the view keeps the new flag alive"
    assert flag.gpudata == flag.base.address and flag.gpudata not in (ptr(x),)

    outside = Node(lambda x: perform(x, outside=True), [True])
    for _ in range(MAX_RECORDINGS + 1):
        outside(FakeArray((4,), np.int32))
    assert not outside.tapes.tapes
    assert "argument 0" in outside.tapes.last_refusal


def test_key_distinguishes_geometry_alignment_aliasing_host_values_and_tf32():
    flag = [False]
    tapes = NodeTapes([True, True, False], allocator, None, pack, FIELDS,
                      lambda: flag[0])  # fmt: skip
    a, b = FakeArray((4, 4)), FakeArray((4, 4))
    base = tapes.key([a, b, 3])
    assert tapes.key([FakeArray((4, 4)), FakeArray((4, 4)), 3]) == base
    assert tapes.key([FakeArray((4, 5)), b, 3]) != base
    t = FakeArray((4, 4), strides=(4, 16), gpudata=ptr(a), base=a)
    assert tapes.key([t, b, 3]) != base
    shifted = FakeArray((4, 4), gpudata=ptr(a) + 4, base=a)
    assert tapes.key([shifted, b, 3]) != base
    assert tapes.key([a, a, 3]) != base, "an input passed twice is another key"
    assert tapes.key([a, b, 4]) != base
    flag[0] = True
    assert tapes.key([a, b, 3]) != base
    big = np.zeros(tape.HOST_KEY_MAX_ELEMENTS + 1, np.int64)
    assert tapes.key([a, b, big]) is None
    assert tapes.key([FakeArray((0,)), b, 3]) is None, "an empty input has no tape"
    assert tapes.key([a, b, "text"]) is None


def test_key_of_three_inputs_tells_which_share_an_address():
    tapes = NodeTapes([True] * 3, allocator, None, pack, FIELDS, lambda: False)
    a, b, c = (FakeArray((4,)) for _ in range(3))
    patterns = ([a, b, c], [a, b, b], [a, a, b], [b, a, b])
    assert len({tapes.key(v) for v in patterns}) == 4, "abc, abb, aab, aba differ"
    assert tapes.key([a, b, b]) == tapes.key([c, a, a]), "the pattern, not the names"


class FakeDriver:
    """The driver calls array's copies and memsets report (note_driver)."""

    def __init__(self, log):
        self.log = log

    def memset_d8_async(self, dst, value, n, stream):
        self.log.append(("memset", dst, value, n, stream))

    def memcpy_dtod_async(self, dst, src, n, stream):
        self.log.append(("copy", dst, src, n, stream))


def test_driver_copies_and_memsets_replay_with_new_pointers():
    log = []
    drv = FakeDriver(log)

    def perform(x):
        out = FakeArray((2, *x.shape))
        n = x.size * x.dtype.itemsize
        # zero the first half, copy x into the second (offset n)
        args = (ptr(out), 0, n, "s")
        drv.memset_d8_async(*args)
        tape.note_driver("memset_d8_async", args, (0,))
        args = (ptr(out) + n, ptr(x), n, "s")
        drv.memcpy_dtod_async(*args)
        tape.note_driver("memcpy_dtod_async", args, (0, 1))
        return out

    tapes = NodeTapes([True], allocator, lambda: drv, pack, FIELDS, lambda: False)
    node = Node(perform, [True])
    node.tapes = tapes
    node(FakeArray((4,)))
    node(FakeArray((4,)))
    assert tapes.tapes
    log.clear()
    x = FakeArray((4,))
    out = node(x)
    assert node.performed == 2
    assert log == [
        ("memset", ptr(out), 0, 16, "s"),
        ("copy", ptr(out) + 16, ptr(x), 16, "s"),
    ]
    assert out.shape == (2, 4)


def test_replays_allocate_from_the_pools_own_allocate():
    """A replay never records and never runs while a graph captures, so it
    takes the allocator's ``raw`` (PoolAllocator's pool.allocate)."""
    raw_sizes = []

    class Pool:
        def __call__(self, nbytes):  # what perform's allocations go through
            return FakeAlloc(nbytes)

        def raw(self, nbytes):
            raw_sizes.append(nbytes)
            return FakeAlloc(nbytes)

    pool = Pool()
    k = FakeKernel("k", [])

    def perform(x):
        out = FakeArray(x.shape)
        launch(k, [x, out])
        return out

    node = Node(perform, [True])
    node.tapes = NodeTapes([True], pool, lambda: None, pack, FIELDS, lambda: False)
    node(FakeArray((4,)))
    node(FakeArray((4,)))
    assert raw_sizes == []
    out = node(FakeArray((4,)))
    assert raw_sizes == [16] and int(out.gpudata) == out.gpudata.address
    (t,) = node.tapes.tapes.values()
    assert "def play(values, out_cells):" in t.source


def test_switching_tapes_off_runs_perform():
    log = []
    node = scale_node(log)
    for _ in range(2):
        node(FakeArray((4,)), np.float32(1.0))
    tape.set_enabled(False)
    try:
        node(FakeArray((4,)), np.float32(1.0))
        assert node.performed == 3
    finally:
        tape.set_enabled(True)
    node(FakeArray((4,)), np.float32(1.0))
    assert node.performed == 3
    with pytest.raises(TypeError, match="flag must be a bool"):
        tape.set_enabled(1)


def test_tapes_per_node_are_bounded():
    node = scale_node([])
    for n in range(tape.MAX_TAPES_PER_NODE + 3):
        for _ in range(2):
            node(FakeArray((n + 1,)), np.float32(1.0))
    assert len(node.tapes.tapes) == tape.MAX_TAPES_PER_NODE


# --------------------------------------------------------------------------
# GPU: taped functions give the untaped values, call after call
# --------------------------------------------------------------------------


def _run_both(build, batches, tf32=False):
    """Outputs of ``build()``'s function over ``batches`` with tapes on, and of
    a second one with tapes off, plus the taped function's tape report."""
    import cc2ops.cuda as cuda

    results = {}
    for enabled in (True, False):
        fn = build()
        tape.set_enabled(enabled)
        try:
            with cuda.allow_tf32(tf32):
                results[enabled] = [
                    [np.asarray(o) for o in fn(*b)] for b in batches
                ]  # fmt: skip
        finally:
            tape.set_enabled(True)
        if enabled:
            report = cuda.launch_tapes(fn)
    return results[True], results[False], report


def _step_builder(classes=10):
    import pytensor
    import pytensor.tensor as pt

    import cc2ops
    import cc2ops.cuda as cuda

    r = np.random.default_rng(0)
    w1_0 = (0.2 * r.standard_normal((8, 3, 3, 3))).astype(np.float32)
    w2_0 = (0.1 * r.standard_normal((8 * 4 * 4, classes))).astype(np.float32)
    w3_0 = (0.2 * r.standard_normal((8, 8, 3, 3))).astype(np.float32)

    def build():
        x = pt.tensor4("x", dtype="float32")  # (B, 3, 8, 8)
        y = pt.ivector("y")
        w1 = cuda.shared(w1_0.copy(), name="w1")
        w2 = cuda.shared(w2_0.copy(), name="w2")
        w3 = cuda.shared(w3_0.copy(), name="w3")
        h = pt.maximum(cc2ops.conv2d(x, w1, padding=1), 0)
        h = pt.maximum(cc2ops.conv2d(h, w3, padding=1), 0)  # needs ImageActs
        h = cc2ops.cross_map_norm(h, size=3)
        h = cc2ops.max_pool2d(h, 2)
        logits = h.flatten(2) @ w2
        loss = cc2ops.softmax_cross_entropy(logits, y).mean()
        g1, g2, g3 = pytensor.grad(loss, [w1, w2, w3])
        lr = np.float32(0.05)
        return pytensor.function(
            [x, y], [loss, h.sum()],
            updates=[(w1, w1 - lr * g1), (w2, w2 - lr * g2), (w3, w3 - lr * g3)],
            mode=cuda.mode(),
        )  # fmt: skip

    return build


def _batches(n, b=16, classes=10, seed=1):
    r = np.random.default_rng(seed)
    return [
        (
            r.standard_normal((b, 3, 8, 8)).astype(np.float32),
            r.integers(0, classes, b).astype(np.int32),
        )
        for _ in range(n)
    ]


@gpu
def test_gpu_training_step_replays_tapes_with_the_untaped_values():
    taped, plain, report = _run_both(_step_builder(), _batches(7))
    for k, (a, b) in enumerate(zip(taped, plain, strict=True)):
        for j, (u, v) in enumerate(zip(a, b, strict=True)):
            np.testing.assert_allclose(
                u, v, rtol=1e-5, atol=1e-6, err_msg=f"call {k}, output {j}"
            )
    played = {e["op"].split("{")[0] for e in report if e["plays"]}
    for op in ("GpuFilterActs", "GpuImageActs", "GpuWeightActs", "GpuMaxPool",
               "GpuCrossMapNorm", "GpuElemwise", "GpuDot22",
               "GpuSoftmaxCrossEntropy", "GpuSoftmaxCrossEntropyGrad"):  # fmt: skip
        assert any(p.startswith(op) for p in played), (op, report)


@gpu
def test_gpu_dropout_with_a_gpu_state_replays_with_new_masks_each_call():
    """The kernel reads key and counter from the GPU state (advanced by the
    state's default update), so one tape serves every call; the masks still
    change call after call, as with tapes off. A host state is never taped."""
    import pytensor
    import pytensor.tensor as pt

    import cc2ops
    import cc2ops.cuda as cuda

    r = np.random.default_rng(3)
    w0 = (0.3 * r.standard_normal((12, 16))).astype(np.float32)

    def build(device=0):
        x = pt.matrix("x", dtype="float32")
        w = cuda.shared(w0.copy(), name="w")
        state = cc2ops.dropout_state(7, device=device)
        h = cc2ops.dropout(pt.maximum(x @ w, 0), 0.5, state)
        loss = (h**2).mean()
        (g,) = pytensor.grad(loss, [w])
        return pytensor.function(
            [x], [h, loss], updates=[(w, w - np.float32(0.1) * g)],
            mode=cuda.mode(),
        )  # fmt: skip

    batches = [(r.standard_normal((8, 12)).astype(np.float32),) for _ in range(6)]
    taped, plain, report = _run_both(build, batches)
    for k, (a, b) in enumerate(zip(taped, plain, strict=True)):
        np.testing.assert_array_equal(a[0] == 0, b[0] == 0, err_msg=f"mask, call {k}")
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6, err_msg=f"loss, call {k}")
    assert not np.array_equal(taped[-1][0] == 0, taped[-2][0] == 0), "masks change"
    played = {e["op"].split("{")[0] for e in report if e["plays"]}
    assert {"GpuDropout", "GpuDropoutAdvance"} <= played, report


@gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_tf32_switch_is_part_of_the_key(tf32):
    import pytensor
    import pytensor.tensor as pt

    import cc2ops.cuda as cuda

    r = np.random.default_rng(2)
    a = r.standard_normal((192, 160)).astype(np.float32)
    b = r.standard_normal((160, 96)).astype(np.float32)

    def build():
        x, w = pt.matrix("x", dtype="float32"), pt.matrix("w", dtype="float32")
        prod = cuda.gpu_from_host(x) @ cuda.gpu_from_host(w)
        return pytensor.function([x, w], [prod], mode=cuda.mode())

    fn = build()
    with cuda.allow_tf32(not tf32):
        for _ in range(3):  # tapes recorded under the other setting
            fn(a, b)
    tape.set_enabled(False)
    try:
        with cuda.allow_tf32(tf32):
            want = np.asarray(build()(a, b)[0])
    finally:
        tape.set_enabled(True)
    with cuda.allow_tf32(tf32):
        for _ in range(3):
            got = np.asarray(fn(a, b)[0])
            np.testing.assert_array_equal(got, want)
    report = cuda.launch_tapes(fn)
    assert any(e["op"].startswith("GpuDot22") and e["plays"] for e in report), report


@gpu
def test_gpu_new_shapes_views_and_in_place_work_follow_numpy():
    import pytensor
    import pytensor.tensor as pt

    import cc2ops.cuda as cuda

    x = pt.matrix("x", dtype="float32")
    y = pt.matrix("y", dtype="float32")
    # GPU inputs (host ones would keep this graph on the host)
    h = cuda.gpu_from_host(x) * 2 + cuda.gpu_from_host(y)
    outs = [h.T[1:], (h**2).sum(axis=0), h.reshape((-1,))[::3], pt.exp(h).max()]
    fn = pytensor.function([x, y], outs, mode=cuda.mode())
    r = np.random.default_rng(3)
    for shape in [(5, 7)] * 4 + [(9, 4)] * 4 + [(5, 7)] * 2:
        a = r.standard_normal(shape).astype(np.float32)
        b = r.standard_normal(shape).astype(np.float32)
        hh = a * 2 + b
        want = [hh.T[1:], (hh**2).sum(axis=0), hh.reshape(-1)[::3], np.exp(hh).max()]
        got = fn(a, b)
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_allclose(
                np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=f"{shape} out {j}"
            )
    report = cuda.launch_tapes(fn)
    assert max(e["tapes"] for e in report) == 2, report
