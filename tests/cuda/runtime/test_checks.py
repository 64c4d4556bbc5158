"""Deferred checks (:mod:`cc2ops.cuda.runtime.checks`), the VM scope that makes
them (:class:`cc2ops.cuda.mode.CheckedVM`) and the nodes that flush them
before writing into a function input (:func:`cc2ops.cuda.mode.writes_function_input`).

CPU tests drive the scope with plain callables and the flag staging with a
fake driver and device (pinned slots, an event, an asynchronous copy), and
check that: nothing runs before a flush; each wait runs once, before its
checks; the first failing check drops the rest and says it was deferred; a
scope closed by an error drops its checks; a VM whose check fails hands the
updated inputs their old values back and is not blamed on a node. GPU tests
run a training step with a bad label eagerly (it raises, the parameters are
untouched, the next good step matches a fresh function's) and count the
read-backs of a good step (none before the outputs).
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
import pytest
from pytensor.tensor.elemwise import Elemwise

from cc2ops.cuda.runtime import checks

gpu = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    while checks.deferring():
        checks.scope_close(run=False)
    checks.discard()


# --------------------------------------------------------------------------
# CPU: the scope
# --------------------------------------------------------------------------


def test_checks_wait_for_the_flush_and_each_wait_runs_once_first():
    log = []
    assert not checks.deferring()
    with pytest.raises(RuntimeError, match="defer outside a scope"):
        checks.defer(lambda: None, lambda: None)
    checks.scope_open()
    assert checks.deferring() and not checks.pending()

    def wait_a():
        log.append("wait a")

    checks.defer(wait_a, lambda: log.append("check 1"))
    checks.defer(wait_a, lambda: log.append("check 2"))
    checks.defer(lambda: log.append("wait b"), lambda: log.append("check 3"))
    assert log == [] and checks.pending()
    checks.scope_close()
    assert log == ["wait a", "check 1", "check 2", "wait b", "check 3"]
    assert not checks.deferring() and not checks.pending()


def test_the_first_failing_check_drops_the_rest_and_says_it_was_deferred():
    ran = []

    def bad():
        raise ValueError("GpuThing: labels must be in [0, K) = [0, 3), got 7 at row 1")

    checks.scope_open()
    checks.defer(lambda: None, bad)
    checks.defer(lambda: None, lambda: ran.append("later"))
    with pytest.raises(ValueError, match="got 7 at row 1") as info:
        checks.scope_close()
    assert any("deferred device check" in n for n in info.value.__notes__)
    assert ran == [] and not checks.pending() and not checks.deferring()


def test_a_scope_closed_by_an_error_drops_its_checks():
    ran = []
    checks.scope_open()
    checks.defer(lambda: None, lambda: ran.append("check"))
    checks.scope_close(run=False)
    assert ran == [] and not checks.pending()


def test_nested_scopes_defer_until_the_inner_one_closes():
    ran = []
    checks.scope_open()
    checks.scope_open()
    checks.defer(lambda: None, lambda: ran.append("inner"))
    checks.scope_close()
    assert ran == ["inner"] and checks.deferring(), "the outer scope is still open"
    checks.scope_close()
    assert not checks.deferring()


# --------------------------------------------------------------------------
# CPU: flag staging, against a fake driver and device
# --------------------------------------------------------------------------


class FakeEvent:
    def __init__(self, log):
        self.log = log

    def record(self, stream):
        self.log.append(("record", stream))

    def synchronize(self):
        self.log.append(("synchronize",))


class FakeDriver:
    """Device memory is a dict address -> uint32; copies land at once."""

    def __init__(self):
        self.memory = {}
        self.log = []

    def pagelocked_empty(self, shape, dtype):
        return np.full(shape, 0xDEAD, dtype)

    def Event(self):  # noqa: N802  (pycuda's name)
        return FakeEvent(self.log)

    def memcpy_dtoh_async(self, dest, src, stream):
        self.log.append(("copy", src, stream))
        dest[...] = self.memory[src]


class FakeDevice:
    index = 0
    stream = "stream0"

    def activate(self):
        pass


class FakeFlag:
    def __init__(self, drv, address, value):
        self.gpudata = address
        drv.memory[address] = value


@pytest.fixture
def fake_cuda(monkeypatch):
    from cc2ops.cuda.runtime import availability, device

    drv = FakeDriver()
    monkeypatch.setattr(availability, "driver", lambda: drv)
    monkeypatch.setattr(device, "get_device", lambda label: FakeDevice())
    monkeypatch.setattr(checks, "_state", checks._State())
    return drv


def test_flags_are_copied_without_waiting_and_read_after_the_event(fake_cuda):
    drv = fake_cuda
    seen = []
    checks.scope_open()
    for k, value in enumerate((0xFFFFFFFF, 5, 0xFFFFFFFF)):
        checks.defer_flag(FakeFlag(drv, 0x1000 + 16 * k, value), 0, seen.append)
    assert [e[0] for e in drv.log] == ["copy", "record"] * 3
    assert seen == [], "nothing is read before the flush"
    checks.scope_close()
    assert drv.log[-1] == ("synchronize",), "one wait, on the latest event"
    assert seen == [0xFFFFFFFF, 5, 0xFFFFFFFF], "each check reads its own slot"


def test_a_full_set_of_slots_flushes_before_the_next_copy(fake_cuda):
    drv = fake_cuda
    seen = []
    checks.scope_open()
    for k in range(checks.SLOTS + 2):
        checks.defer_flag(FakeFlag(drv, 0x1000 + 16 * k, k), 0, seen.append)
    assert seen == list(range(checks.SLOTS)), "the first SLOTS were read to free them"
    checks.scope_close()
    assert seen == list(range(checks.SLOTS + 2))


# --------------------------------------------------------------------------
# CPU: the VM scope
# --------------------------------------------------------------------------


class FakeFGraph:
    def __init__(self, inputs, update_mapping):
        self.inputs = inputs
        self.update_mapping = update_mapping


class FakeVM:
    """Updates input 1 in its storage (as PyTensor's VMs do), after a check."""

    position_of_error = 0

    def __init__(self, fail_check=False, raise_inside=False):
        self.storage_map = {"x": ["x0"], "w": ["w0"]}
        self.fail_check = fail_check
        self.raise_inside = raise_inside
        self.thunks = ["t0"]

    def __call__(self):
        assert checks.deferring(), "the VM runs inside a scope"

        def check():
            if self.fail_check:
                raise ValueError("GpuThing: labels must be in [0, K), got 9 at row 0")

        checks.defer(lambda: None, check)
        if self.raise_inside:
            raise RuntimeError("GpuThing: a node failed")
        self.storage_map["w"][0] = "w1"
        return ["loss"]


def _checked(vm):
    from cc2ops.cuda.mode import CheckedVM

    return CheckedVM(vm, FakeFGraph(["x", "w"], {1: 1}))


def test_checked_vm_keeps_updates_when_its_checks_pass():
    vm = FakeVM()
    checked = _checked(vm)
    assert checked() == ["loss"]
    assert vm.storage_map["w"] == ["w1"]
    assert checked.position_of_error == 0 and checked.thunks == ["t0"]
    checked.thunks = ["wrapped"]  # what profilers do
    assert vm.thunks == ["wrapped"], "attributes are set on the wrapped VM"


def test_checked_vm_restores_updated_inputs_when_a_check_fails():
    vm = FakeVM(fail_check=True)
    checked = _checked(vm)
    with pytest.raises(ValueError, match="got 9 at row 0"):
        checked()
    assert vm.storage_map["w"] == ["w0"], "the update is undone"
    assert vm.storage_map["x"] == ["x0"]
    assert not hasattr(checked, "position_of_error"), "no node is blamed"
    vm.fail_check = False
    checked()
    assert vm.storage_map["w"] == ["w1"]
    assert checked.position_of_error == 0


def test_checked_vm_drops_checks_when_a_node_fails():
    vm = FakeVM(fail_check=True, raise_inside=True)
    checked = _checked(vm)
    with pytest.raises(RuntimeError, match="a node failed"):
        checked()
    assert not checks.pending() and not checks.deferring()


def test_thunk_profile_times_a_flushing_node_without_the_checks_wait():
    """ThunkProfile's host pass holds the stream for the whole step, so the
    deferred checks a writer node reads first would wait for the hold: that
    wait is the check's, and is taken before the node's clock starts."""
    import time

    from cc2ops.cuda.mode import _flush_first
    from cc2ops.cuda.runtime.profile import ThunkProfile

    class HostOp:  # no thunk_device: a host node (no device, no hold)
        pass

    class Node:
        op = HostOp()

    def loss():  # defers a check whose wait takes 40 ms
        checks.defer(lambda: time.sleep(0.04), lambda: None)

    writer = _flush_first(lambda: None)

    class VM:
        nodes = [Node(), Node()]
        thunks = [loss, writer]

    class Fn:
        vm = VM()

        def __call__(self):
            checks.scope_open()
            try:
                for thunk in self.vm.thunks:
                    thunk()
            finally:
                checks.scope_close()

    res = ThunkProfile(Fn()).run(steps=1, warmup=0)
    first, second = res["per_node"]
    assert second["host_ms_isolated"] >= 35.0, "the first pass times the wait"
    assert second["host_ms"] < 10.0, second
    assert not checks.pending() and not checks.deferring()


# --------------------------------------------------------------------------
# CPU: which nodes write into a function's inputs
# --------------------------------------------------------------------------


def test_writes_function_input_follows_views_back_to_the_inputs():
    from cc2ops.cuda.mode import writes_function_input

    add_inplace = Elemwise(ps.add, {0: 0})  # writes into its first input
    mul_inplace = Elemwise(ps.mul, {0: 0})
    x, y = pt.matrix("x"), pt.matrix("y")
    w = pytensor.shared(np.zeros((2, 2)), name="w")
    direct = add_inplace(w, y).owner
    through_view = add_inplace(x.T, y).owner
    through_inplace = mul_inplace(add_inplace(x, y), y).owner
    fresh = add_inplace(x + 1, y).owner
    plain = (x + y).owner
    assert writes_function_input(direct)
    assert writes_function_input(through_view)
    assert writes_function_input(through_inplace)
    assert not writes_function_input(fresh), "x + 1 is a new buffer"
    assert not writes_function_input(plain)


# --------------------------------------------------------------------------
# GPU: an eager training step
# --------------------------------------------------------------------------


def _step(mode_kwargs=None):
    import cc2ops
    import cc2ops.cuda as cuda

    r = np.random.default_rng(0)
    w0 = (0.3 * r.standard_normal((3 * 4 * 4, 5))).astype(np.float32)
    xv = pt.tensor4("x", dtype="float32")
    yv = pt.ivector("y")
    w = cuda.shared(w0.copy(), name="w")
    v = cuda.shared(np.zeros_like(w0), name="v")
    logits = xv.flatten(2) @ w
    loss = cc2ops.softmax_cross_entropy(logits, yv).mean()
    err = cc2ops.top_k_error(logits, yv, 1).mean()
    (g,) = pytensor.grad(loss, [w])
    v_new = np.float32(0.9) * v - np.float32(0.1) * g
    fn = pytensor.function(
        [xv, yv], [loss, err], updates=[(v, v_new), (w, w + v_new)],
        mode=cuda.mode(**(mode_kwargs or {})),
    )  # fmt: skip
    return fn, w, v, w0


def _batch(seed, bad_row=None):
    r = np.random.default_rng(seed)
    x = r.standard_normal((6, 3, 4, 4)).astype(np.float32)
    y = r.integers(0, 5, 6).astype(np.int32)
    if bad_row is not None:
        y[bad_row] = 5
    return x, y


@gpu
def test_gpu_bad_label_raises_and_leaves_the_parameters_as_they_were():
    from cc2ops.cuda import launch_tapes
    from cc2ops.cuda.runtime.array import to_host

    fn, w, v, w0 = _step()
    good = (1, 5, 6)  # from the third call on, the loss nodes replay tapes
    for seed in good:
        fn(*_batch(seed))
    played = {e["op"].split("{")[0] for e in launch_tapes(fn) if e["plays"]}
    assert {"GpuSoftmaxCrossEntropy", "GpuTopKError"} <= played, played
    w_before, v_before = to_host(w.get_value()), to_host(v.get_value())
    with pytest.raises(ValueError, match=r"labels must be in \[0, K\) = \[0, 5\)"):
        fn(*_batch(2, bad_row=3))
    np.testing.assert_array_equal(to_host(w.get_value()), w_before)
    np.testing.assert_array_equal(to_host(v.get_value()), v_before)
    # the function goes on as if the bad call had not happened
    fresh, w2, _, _ = _step()
    for seed in good:
        fresh(*_batch(seed))
    a, b = fn(*_batch(3)), fresh(*_batch(3))
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6)
    np.testing.assert_allclose(to_host(w.get_value()), to_host(w2.get_value()),
                               rtol=1e-6, atol=1e-7)  # fmt: skip


@gpu
def test_gpu_a_good_step_reads_no_label_flag_back_while_it_runs(monkeypatch):
    from cc2ops.cuda.runtime import array

    fn, *_ = _step()
    fn(*_batch(1))
    reads = []
    real = array.to_host

    def counting(garray, device=None):
        reads.append((str(garray.dtype), tuple(garray.shape)))
        return real(garray, device)

    monkeypatch.setattr(array, "to_host", counting)
    deferred = []
    real_defer = checks.defer_flag
    monkeypatch.setattr(
        checks, "defer_flag", lambda *a, **k: (deferred.append(1), real_defer(*a, **k))
    )
    fn(*_batch(4))
    assert ("uint32", (1,)) not in reads, "no label flag was read back at once"
    assert len(deferred) == 3, "loss, its gradient and the top-k error"
    assert not checks.pending() and not checks.deferring()


# --------------------------------------------------------------------------
# CPU: a compiled function of the GPU mode, with a host op that defers
# --------------------------------------------------------------------------


class DeferredPositive(pytensor.graph.op.Op):
    """y = x, with a deferred check that x > 0 (as the label checks are)."""

    __props__ = ()

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return pytensor.graph.basic.Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        (x,) = inputs
        bad = np.flatnonzero(x <= 0)

        def check():
            if bad.size:
                raise ValueError(f"DeferredPositive: x must be > 0, got {x[bad[0]]}")

        if checks.deferring():
            checks.defer(lambda: None, check)
        else:
            check()
        outputs[0][0] = x.copy()


@pytest.fixture
def gpu_linker_on_the_cpu(monkeypatch):
    """The GPU mode's linker compiling a host graph as if it held GPU values."""
    import importlib

    # the module (cc2ops.cuda's attribute "mode" is the function)
    cmode = importlib.import_module("cc2ops.cuda.mode")

    monkeypatch.setattr(cmode, "_needs_cuda", lambda fgraph: True)
    monkeypatch.setattr(cmode, "require", lambda: None)
    return cmode


@pytest.mark.parametrize("linker", ["py", "cvm"])
def test_a_failing_deferred_check_leaves_shared_variables_as_they_were(
    gpu_linker_on_the_cpu, linker
):
    cmode = gpu_linker_on_the_cpu
    x = pt.dvector("x")
    w = pytensor.shared(np.ones(3), name="w")  # updated in place
    n = pytensor.shared(np.float64(0.0), name="n")  # updated by value
    y = DeferredPositive()(x)
    fn = pytensor.function(
        [x], y.sum(), updates=[(w, w + y), (n, n + y.sum())],
        mode=cmode.mode(linker=linker),
    )  # fmt: skip
    assert isinstance(fn.vm, cmode.CheckedVM)
    fgraph = fn.maker.fgraph
    writers = [nd for nd in fgraph.apply_nodes if cmode.writes_function_input(nd)]
    assert writers, "the update of w is in place"
    flushing = [t for t in fn.vm.thunks if getattr(t, "flushes_checks", False)]
    assert len(flushing) == len(writers)

    assert fn(np.array([1.0, 2.0, 3.0])) == 6.0
    np.testing.assert_array_equal(w.get_value(), [2.0, 3.0, 4.0])
    assert n.get_value() == 6.0
    with pytest.raises(ValueError, match="DeferredPositive: x must be > 0, got -2"):
        fn(np.array([1.0, -2.0, 3.0]))
    np.testing.assert_array_equal(w.get_value(), [2.0, 3.0, 4.0])
    assert n.get_value() == 6.0, "the update by value is undone"
    assert not checks.pending() and not checks.deferring()
    assert fn(np.array([1.0, 1.0, 1.0])) == 3.0
    np.testing.assert_array_equal(w.get_value(), [3.0, 4.0, 5.0])
    assert n.get_value() == 9.0
