"""CudaArrayType and its variables, constants and shared variables, on the CPU.

Nothing here may touch CUDA: CI builds GPU graphs without a GPU. The
``no_cuda`` fixture makes every path that would reach the driver fail loudly.
GPUArray acceptance is checked with a small stand-in object that has the
attributes ``filter`` reads (gpudata, shape, dtype, strides, allocator).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Variable
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.type import TensorType

import cc2ops.cuda as cuda
from cc2ops.cuda import type as ctype
from cc2ops.cuda.runtime import availability, device
from cc2ops.cuda.runtime.device import PoolAllocator
from cc2ops.cuda.transfer import GpuFromHost, GpuToGpu, HostFromGpu
from cc2ops.cuda.type import (
    CudaArrayConstant,
    CudaArrayType,
    CudaArrayVariable,
    CudaSharedVariable,
)


class FakeGpuArray:
    """Just what CudaArrayType.filter reads of a pycuda GPUArray."""

    def __init__(self, shape, dtype, physical=None, ptr=0x10000, strides=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        if strides is None:
            strides, acc = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(acc)
                acc *= max(n, 1)
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.gpudata = ptr
        self.allocator = None if physical is None else PoolAllocator(physical, None)


@pytest.fixture
def no_cuda(monkeypatch):
    """Fail if anything tries to reach CUDA."""

    def boom(*args, **kwargs):
        raise AssertionError("CUDA was touched")

    monkeypatch.setattr(availability, "driver", boom)
    monkeypatch.setattr(ctype, "to_gpu", boom)
    monkeypatch.setattr(ctype, "to_host", boom)
    monkeypatch.setattr(ctype, "copy", boom)


@pytest.fixture
def device_map():
    """Restore the label -> physical map after a test changes it."""
    saved = device._explicit_map
    yield device.set_device_map
    device._explicit_map = saved


# --------------------------------------------------------------------------
# the type
# --------------------------------------------------------------------------


def test_props_eq_hash_str():
    t = CudaArrayType("float32", (None, 3), 0)
    assert CudaArrayType.__props__ == ("dtype", "shape", "device")
    assert t._props() == ("float32", (None, 3), 0)
    assert t == CudaArrayType(np.float32, [None, 3], 0)
    assert hash(t) == hash(CudaArrayType("float32", (None, 3), 0))
    assert t != CudaArrayType("float32", (None, 3), 1)
    assert t != CudaArrayType("float64", (None, 3), 0)
    assert t != CudaArrayType("float32", (None, None), 0)
    assert t != TensorType("float32", (None, 3))
    assert str(t) == "CudaArrayType(float32, shape=(None, 3), device=0)"
    assert repr(t) == str(t)
    assert (
        str(CudaArrayType("int8", (5,), 2))
        == "CudaArrayType(int8, shape=(5,), device=2)"
    )
    assert (
        str(CudaArrayType("bool", (), 0)) == "CudaArrayType(bool, shape=(), device=0)"
    )
    assert pickle.loads(pickle.dumps(t)) == t


def test_attributes_and_clone():
    t = CudaArrayType("float64", (1, None, 4), 1)
    assert (t.ndim, t.dtype, t.device) == (3, "float64", 1)
    assert t.broadcastable == (True, False, False)
    assert t.numpy_dtype == np.dtype("float64")
    assert t.host_type() == TensorType("float64", (1, None, 4))
    assert t.clone(device=0) == CudaArrayType("float64", (1, None, 4), 0)
    assert t.clone(dtype="float32") == CudaArrayType("float32", (1, None, 4), 1)
    assert t.clone(shape=(2,)) == CudaArrayType("float64", (2,), 1)
    # TensorType's broadcastable convention
    assert CudaArrayType("float32", (True, False), 0).shape == (1, None)
    assert CudaArrayType("float32", 7, 0).shape == (7,)


@pytest.mark.parametrize(
    "args, exc, match",
    [
        (("object", (None,), 0), TypeError, "dtype object is not supported"),
        (("no-such-dtype", (None,), 0), TypeError, "invalid dtype"),
        (("float32", (None,), -1), ValueError, "device must be >= 0, got -1"),
        (("float32", (None,), "0"), TypeError, "device must be an int label, got str"),
        (("float32", (None,), True), TypeError, "device must be an int label"),
        (("float32", (-2,), 0), ValueError, "shape entries must be >= 0"),
        (
            ("float32", (1.5,), 0),
            TypeError,
            "shape entries must be int or None, got float",
        ),
        (("float32", None, 0), TypeError, "shape must be a tuple"),
    ],
)
def test_constructor_rejects(args, exc, match):
    with pytest.raises(exc, match=match):
        CudaArrayType(*args)


def test_type_relations():
    t = CudaArrayType("float32", (None, 3), 0)
    more = CudaArrayType("float32", (2, 3), 0)
    assert t.is_super(more) and t.is_super(t)
    assert not more.is_super(t)
    assert not t.is_super(CudaArrayType("float32", (None, 3), 1))
    assert not t.is_super(CudaArrayType("float64", (None, 3), 0))
    assert not t.is_super(TensorType("float32", (None, 3)))
    assert t.in_same_class(CudaArrayType("float32", (5, 3), 0))
    assert not t.in_same_class(CudaArrayType("float32", (1, 3), 0))
    assert not t.in_same_class(CudaArrayType("float32", (None, 3), 1))


# --------------------------------------------------------------------------
# filter
# --------------------------------------------------------------------------


def test_filter_accepts_gpuarray_as_is(no_cuda):
    t = CudaArrayType("float32", (None, 3), 0)
    a = FakeGpuArray((4, 3), "float32", physical=0)
    assert t.filter(a) is a
    assert t.filter(a, strict=True) is a
    # an array from another allocator has an unknown device and is trusted
    b = FakeGpuArray((4, 3), "float32", physical=None)
    assert t.filter(b, strict=True) is b
    # non-contiguous views are valid values
    view = FakeGpuArray((4, 3), "float32", physical=0, strides=(4, 16))
    assert t.is_valid_value(view)


@pytest.mark.parametrize(
    "value, match",
    [
        (FakeGpuArray((4, 3), "float64", 0), "has dtype float64, expected float32"),
        (FakeGpuArray((4, 3, 1), "float32", 0), "has 3 dims .* expected 2"),
        (
            FakeGpuArray((4, 2), "float32", 0),
            r"shape \(4, 2\) does not match .*\(None, 3\)",
        ),
        (
            FakeGpuArray((4, 3), "float32", 1),
            "lives on physical device 1, but device label 0",
        ),
    ],
)
def test_filter_rejects_gpuarray(no_cuda, value, match):
    t = CudaArrayType("float32", (None, 3), 0)
    with pytest.raises(TypeError, match=match):
        t.filter(value)
    with pytest.raises(TypeError, match=match):
        t.filter(value, strict=True)
    assert not t.is_valid_value(value)


def test_filter_device_follows_the_device_map(no_cuda, device_map):
    # label 7 is never used by other tests, so it may be remapped here
    t7 = CudaArrayType("float32", (None,), 7)
    on_physical_0 = FakeGpuArray((2,), "float32", physical=0)
    with pytest.raises(TypeError, match="label 7 is physical device 7"):
        t7.filter(on_physical_0)
    device_map({**device.device_map(), 7: 0})
    assert t7.filter(on_physical_0) is on_physical_0


def test_filter_strict_rejects_host_data(no_cuda):
    t = CudaArrayType("float32", (None,), 0)
    with pytest.raises(
        TypeError, match="strict filtering needs a pycuda GPUArray, got ndarray"
    ):
        t.filter(np.zeros(3, "float32"), strict=True)
    with pytest.raises(TypeError, match="got the symbolic variable"):
        t.filter(pt.vector())
    assert not t.is_valid_value(np.zeros(3, "float32"))


def test_filter_host_follows_tensortype_rules(no_cuda):
    t = CudaArrayType("float32", (None, 2), 0)
    out = t.filter_host([[1, 2], [3, 4]])
    assert out.dtype == np.float32 and out.shape == (2, 2)
    with pytest.raises(TypeError, match=r"CudaArrayType\(float32.*loss of precision"):
        t.filter_host(np.zeros((2, 2), "float64"))
    assert (
        t.filter_host(np.zeros((2, 2), "float64"), allow_downcast=True).dtype
        == np.float32
    )
    with pytest.raises(TypeError, match="Wrong number of dimensions"):
        t.filter_host(np.zeros(3, "float32"))
    with pytest.raises(TypeError, match="not compatible"):
        t.filter_host(np.zeros((2, 3), "float32"))
    with pytest.raises(TypeError, match="expected an ndarray"):
        t.filter_host([[1.0, 2.0]], strict=True)


def test_filter_of_host_data_copies_to_the_device(monkeypatch):
    sent = []

    def fake_to_gpu(array, device):
        sent.append((array, device))
        return "on-gpu"

    monkeypatch.setattr(ctype, "to_gpu", fake_to_gpu)
    t = CudaArrayType("float32", (None,), 3)
    assert t.filter([1, 2, 3]) == "on-gpu"
    ((array, label),) = sent
    assert label == 3 and array.dtype == np.float32
    np.testing.assert_array_equal(array, [1, 2, 3])


def test_values_eq_on_host_values():
    a = np.array([1.0, np.nan, 3.0])
    assert CudaArrayType.values_eq(a, a.copy())
    assert not CudaArrayType.values_eq(a, np.array([1.0, 2.0, 3.0]))
    assert CudaArrayType.values_eq_approx(a, a + 1e-9)
    assert not CudaArrayType.values_eq_approx(a, a + 1e-3)
    assert CudaArrayType.values_eq_approx(
        np.array([np.inf, 1.0]), np.array([5.0, 1.0]), allow_remove_inf=True
    )
    assert not CudaArrayType.values_eq_approx(a, a[:2])


def test_may_share_memory_from_pointer_ranges():
    may = CudaArrayType.may_share_memory
    a = FakeGpuArray((4, 4), "float32", 0, ptr=1000)  # bytes [1000, 1064)
    assert may(a, a)
    inside = FakeGpuArray((2,), "float32", 0, ptr=1060)
    after = FakeGpuArray((2,), "float32", 0, ptr=1064)
    assert may(a, inside) and may(inside, a)
    assert not may(a, after)
    # a reversed view reaching backwards from its first element
    backwards = FakeGpuArray((3,), "float32", 0, ptr=1000, strides=(-4,))
    before = FakeGpuArray((1,), "float32", 0, ptr=992)
    assert may(backwards, before)
    assert not may(FakeGpuArray((0, 4), "float32", 0, ptr=1000), a)
    x = np.zeros(4)
    assert may(x, x[1:]) and not may(x, np.zeros(4))
    assert not may(x, a)


# --------------------------------------------------------------------------
# variables, constants, shared variables
# --------------------------------------------------------------------------


def test_variables_and_constants_need_no_cuda(no_cuda):
    t = CudaArrayType("float32", (None, 3), 0)
    x = t("x")
    assert isinstance(x, CudaArrayVariable) and x.type == t and x.name == "x"
    assert (x.ndim, x.dtype, x.broadcastable) == (2, "float32", (False, False))
    k = t.filter_variable([[1, 2, 3]])
    assert isinstance(k, CudaArrayConstant)
    assert k.type == CudaArrayType("float32", (1, 3), 0)
    assert isinstance(k.data, np.ndarray) and not k.data.flags.writeable
    np.testing.assert_array_equal(k.data, [[1, 2, 3]])
    same = CudaArrayConstant(t, np.array([[1, 2, 3]], "float32"))
    assert same.signature() == k.signature()
    assert (
        CudaArrayConstant(t, np.zeros((1, 3), "float32")).signature() != k.signature()
    )


def test_shared_keeps_the_host_value(no_cuda):
    value = np.arange(6, dtype="float32").reshape(2, 3)
    W = cuda.shared(value, device=1, name="W")
    assert isinstance(W, CudaSharedVariable) and isinstance(W, CudaArrayVariable)
    assert W.type == CudaArrayType("float32", (None, None), 1)
    assert W.name == "W" and not W.is_uploaded
    got = W.get_value()
    np.testing.assert_array_equal(got, value)
    got[0, 0] = 99  # a copy
    value[0, 1] = 77  # shared() copied too
    np.testing.assert_array_equal(W.get_value(), np.arange(6).reshape(2, 3))
    assert W.get_value(borrow=True) is W.get_value(borrow=True)
    # no GPUArray before the upload, even when asked for the internal type
    assert isinstance(W.get_value(return_internal_type=True), np.ndarray)


def test_shared_options(no_cuda):
    value = np.zeros((2, 3), "float64")
    assert cuda.shared(value, borrow=True).get_value(borrow=True) is value
    fixed = cuda.shared(value, shape=(2, None))
    assert fixed.type.shape == (2, None)
    with pytest.raises(ValueError, match=r"shape \(3, None\) does not match"):
        cuda.shared(value, shape=(3, None))
    with pytest.raises(TypeError, match="not a symbolic variable"):
        cuda.shared(pt.matrix())
    assert cuda.shared(1.5).type == CudaArrayType("float64", (), 0)


def test_shared_set_value_before_upload(no_cuda):
    W = cuda.shared(np.zeros((2, 2), "float32"))
    new = np.ones((3, 2), "float32")
    W.set_value(new)
    np.testing.assert_array_equal(W.get_value(), new)
    new[0, 0] = 5
    assert W.get_value()[0, 0] == 1  # set_value copied
    W.set_value(new, borrow=True)
    assert W.get_value(borrow=True) is new
    with pytest.raises(TypeError, match="loss of precision"):
        W.set_value(np.zeros((2, 2), "float64"))
    with pytest.raises(TypeError, match="Wrong number of dimensions"):
        W.set_value(np.zeros(2, "float32"))
    assert not W.is_uploaded
    clone = W.clone()
    assert clone.container is W.container and clone.type == W.type


def test_shared_set_value_after_upload_goes_to_the_device(monkeypatch):
    sent = []

    def fake_to_gpu(array, device):
        sent.append((array, device))
        return FakeGpuArray(array.shape, array.dtype, 0)

    monkeypatch.setattr(ctype, "to_gpu", fake_to_gpu)
    W = cuda.shared(np.zeros(3, "float32"))
    W.upload()
    assert W.is_uploaded and len(sent) == 1
    W.upload()  # once only
    assert len(sent) == 1
    W.set_value(np.ones(3, "float32"))
    assert W.is_uploaded and len(sent) == 2
    np.testing.assert_array_equal(sent[1][0], np.ones(3))


def test_as_tensor_variable_gives_host_from_gpu(no_cuda):
    x = CudaArrayType("float32", (None, 3), 0)("x")
    h = pt.as_tensor_variable(x)
    assert isinstance(h.owner.op, HostFromGpu) and h.owner.inputs[0] is x
    assert h.type == TensorType("float32", (None, 3))
    W = cuda.shared(np.zeros((2, 2), "float32"))
    assert isinstance(pt.as_tensor_variable(W).owner.op, HostFromGpu)


def _uses_host_from_gpu_of(out: Variable, x: Variable) -> bool:
    from pytensor.graph.traversal import ancestors

    return any(
        v.owner is not None
        and isinstance(v.owner.op, HostFromGpu)
        and v.owner.inputs[0] is x
        for v in ancestors([out])
    )


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda W: W * 2, (None, 3)),
        (lambda W: 1.0 - W, (None, 3)),
        (lambda W: W.T, (3, None)),
        (lambda W: W[0], (3,)),
        (lambda W: W[1:, ::2], (None, 2)),
        (lambda W: W.sum(), ()),
        (lambda W: W.sum(axis=0), (3,)),
        (lambda W: pt.exp(W), (None, 3)),
        (lambda W: W.reshape((-1,)), (None,)),
        (lambda W: W.dimshuffle(1, "x", 0), (3, 1, None)),
        (lambda W: W @ np.ones((3, 2), "float32"), (None, 2)),
        (lambda W: W.astype("float64"), (None, 3)),
    ],
)
def test_operators_build_host_graphs(no_cuda, build, shape):
    W = CudaArrayType("float32", (None, 3), 0)("W")
    out = build(W)
    assert isinstance(out.type, TensorType)
    assert out.type.shape == shape
    assert _uses_host_from_gpu_of(out, W)


def test_shape_of_gpu_variable(no_cuda):
    W = CudaArrayType("float32", (None, 3), 0)("W")
    s = W.shape
    assert s.type.dtype == "int64" and s.type.shape == (2,)
    assert W.size.ndim == 0


def test_transfer_targets(no_cuda):
    x = CudaArrayType("float32", (None,), 0)("x")
    assert isinstance(x.transfer("cpu").owner.op, HostFromGpu)
    moved = x.transfer("cuda1")
    assert isinstance(moved.owner.op, GpuToGpu) and moved.type.device == 1
    assert x.transfer("cuda0") is x and x.transfer("gpu") is x
    h = pt.vector("h", dtype="float32")
    up = h.transfer("cuda2")
    assert isinstance(up.owner.op, GpuFromHost) and up.owner.op.device == 2
    with pytest.raises(ValueError, match="Can't transfer to target"):
        h.transfer("tpu")


def test_host_expressions_convert_for_updates(no_cuda):
    W = cuda.shared(np.zeros((2, 3), "float32"))
    h = pt.as_tensor_variable(W) * 0.5
    assert h.type.dtype == "float32"
    conv = W.type.filter_variable(h)
    assert isinstance(conv.owner.op, GpuFromHost) and conv.owner.op.device == 0
    assert W.type.is_super(conv.type)
    # a more specific static shape gets specify_shape before the upload
    fixed = cuda.shared(np.zeros((2, 3), "float32"), shape=(2, 3))
    conv = fixed.type.filter_variable(pt.matrix(dtype="float32"))
    assert isinstance(conv.owner.op, GpuFromHost)
    assert isinstance(conv.owner.inputs[0].owner.op, SpecifyShape)
    assert conv.type == fixed.type
    # GPU values on another device move with gpu_to_gpu
    other = CudaArrayType("float32", (None, None), 1)()
    moved = W.type.filter_variable(other)
    assert isinstance(moved.owner.op, GpuToGpu) and moved.type == W.type
    with pytest.raises(TypeError, match="Cannot convert Type"):
        W.type.filter_variable(pt.matrix(dtype="float64"))
    with pytest.raises(TypeError, match="Cannot convert Type"):
        fixed.type.filter_variable(pt.tensor(dtype="float32", shape=(5, 3)))
    with pytest.raises(TypeError, match="Cannot convert Type"):
        W.type.filter_variable(pt.as_tensor_variable(W), allow_convert=False)
