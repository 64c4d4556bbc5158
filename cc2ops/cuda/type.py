"""The GPU type of cc2ops and its variable, constant and shared-variable classes.

:class:`CudaArrayType` is a PyTensor ``Type`` (not a ``TensorType``) whose
values are ``pycuda.gpuarray.GPUArray`` objects on one device *label* (see
:mod:`cc2ops.cuda.runtime.device`). Building graphs with it, and rewriting them,
never touches CUDA:

- variables and constants are plain graph objects; a
  :class:`CudaArrayConstant` keeps its host data until the GPU mode's linker
  uploads it;
- :func:`shared` keeps the host value of a GPU parameter until a function
  using it is linked in the GPU mode (:mod:`cc2ops.cuda.mode`), which uploads
  it once; from then on the parameter lives on the GPU and the function's
  updates to it stay there.

GPU variables act like tensors in expressions: ``W * 2``, ``W.T``, ``W[0]``,
``W.sum()`` and ``pt.as_tensor_variable(W)`` build host graphs through
:func:`~cc2ops.cuda.transfer.host_from_gpu`; the GPU lifting rewrites
(:mod:`cc2ops.cuda.rewriting.lift`) move the work back to the GPU where GPU ops exist.
"""

from __future__ import annotations

import copy as _copy
from types import ModuleType
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile import sharedvalue as _sharedvalue
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import AtomicVariable, Constant, Variable
from pytensor.graph.type import HasShape, Type
from pytensor.graph.utils import add_tag_trace
from pytensor.link.basic import Container
from pytensor.tensor.basic import _as_tensor_variable, register_transfer
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorConstantSignature, _tensor_py_operators

from cc2ops.cuda.runtime.array import (
    SUPPORTED_KINDS,
    copy,
    device_of,
    is_gpuarray,
    ptr,
    to_gpu,
    to_host,
)
from cc2ops.cuda.runtime.device import physical_index


def _transfer() -> ModuleType:
    """:mod:`cc2ops.cuda.transfer`, imported when first needed: the type/transfer seam.

    The type converts between host and GPU variables (``convert_variable``,
    ``as_tensor_variable``, ``x.transfer("cuda1")``, iteration) with the
    transfer ops, and the transfer ops are typed with this type, so one of the
    two must import the other late. This is that import, the only one of the
    GPU graph core; it runs when a graph is built, never at import.
    """
    from cc2ops.cuda import transfer

    return transfer


__all__ = [
    "CudaArrayType",
    "CudaArrayVariable",
    "CudaArrayConstant",
    "CudaSharedVariable",
    "shared",
    "is_gpu_variable",
]


def _parse_shape(shape: Any) -> tuple[int | None, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        items = tuple(shape)
    except TypeError:
        raise TypeError(
            f"CudaArrayType: shape must be a tuple of ints and None, got {shape!r}"
        ) from None
    out: list[int | None] = []
    for s in items:
        if s is None:
            out.append(None)
        elif isinstance(s, (bool, np.bool_)):
            # TensorType's broadcastable convention: True is a static 1
            out.append(1 if s else None)
        elif isinstance(s, (int, np.integer)):
            if s < 0:
                raise ValueError(
                    f"CudaArrayType: shape entries must be >= 0, got {shape!r}"
                )
            out.append(int(s))
        else:
            raise TypeError(
                "CudaArrayType: shape entries must be int or None, got "
                f"{type(s).__name__} in {shape!r}"
            )
    return tuple(out)


def _shapes_compatible(static: tuple[int | None, ...], shape: tuple[int, ...]) -> bool:
    return len(static) == len(shape) and all(
        s is None or s == d for s, d in zip(static, shape, strict=True)
    )


def _host_value(value: Any) -> np.ndarray:
    """A host array of ``value`` (downloads a GPUArray; numpy passes)."""
    if is_gpuarray(value):
        return to_host(value)
    return np.asarray(value)


def _extent(garray: Any) -> tuple[int, int] | None:
    """The device byte range [lo, hi) ``garray`` touches, or ``None`` if empty."""
    if not int(np.prod(garray.shape, dtype=np.int64)):
        return None
    lo = hi = ptr(garray)
    for n, s in zip(garray.shape, garray.strides, strict=True):
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + np.dtype(garray.dtype).itemsize


class CudaArrayType(HasShape, Type):
    """Arrays on a CUDA device: dtype, static shape and device label.

    Parameters
    ----------
    dtype : numpy dtype-like
        Any bool, integer, float or complex dtype.
    shape : tuple of int or None
        The static shape; ``None`` marks an extent known only at run time.
    device : int
        The device label (``0`` by default); see :mod:`cc2ops.cuda.runtime.device`.

    Notes
    -----
    Run-time values are ``pycuda.gpuarray.GPUArray`` objects, possibly
    non-contiguous views. ``filter`` accepts a GPUArray with the right dtype,
    number of dims and static shape (and, when its device is known from its
    allocator, the right physical device); with ``strict=False`` host data is
    converted by TensorType's rules and copied to the device, which touches
    CUDA (only ever at run time).
    """

    __props__ = ("dtype", "shape", "device")

    def __init__(self, dtype: Any, shape: Any, device: int = 0) -> None:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"CudaArrayType: invalid dtype {dtype!r}") from None
        if dt.kind not in SUPPORTED_KINDS:
            raise TypeError(
                f"CudaArrayType: dtype {dt} is not supported on the GPU "
                "(bool, integer, float and complex only)"
            )
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise TypeError(
                "CudaArrayType: device must be an int label, got "
                f"{type(device).__name__}"
            )
        if device < 0:
            raise ValueError(f"CudaArrayType: device must be >= 0, got {device}")
        self.dtype = str(dt)
        self.numpy_dtype = dt
        self.shape = _parse_shape(shape)
        self.ndim = len(self.shape)
        self.broadcastable = tuple(s == 1 for s in self.shape)
        self.device = int(device)
        self._host_type = TensorType(self.dtype, self.shape)

    def clone(
        self,
        dtype: Any = None,
        shape: Any = None,
        device: int | None = None,
        **kwargs: Any,
    ) -> CudaArrayType:
        """A copy with some of dtype, shape and device replaced."""
        return type(self)(
            self.dtype if dtype is None else dtype,
            self.shape if shape is None else shape,
            self.device if device is None else device,
        )

    def host_type(self) -> TensorType:
        """The ``TensorType`` with the same dtype and static shape."""
        return self._host_type

    # values
    def filter_host(
        self, data: Any, strict: bool = False, allow_downcast: bool | None = None
    ) -> np.ndarray:
        """Check or convert host ``data`` by TensorType's rules, without CUDA.

        A GPUArray is downloaded first. Raises ``TypeError`` naming this type.
        """
        if isinstance(data, Variable):
            raise TypeError(
                f"{self}: expected an array, got the symbolic variable {data}; call "
                "the function on values, not on (shared) variables"
            )
        if is_gpuarray(data):
            data = to_host(data)
        try:
            return self._host_type.filter(
                data, strict=strict, allow_downcast=allow_downcast
            )
        except TypeError as e:
            raise TypeError(f"{self}: {e}") from e

    def filter(
        self, data: Any, strict: bool = False, allow_downcast: bool | None = None
    ):
        """A GPUArray for this type, or ``TypeError``.

        A GPUArray is checked (dtype, number of dims, static shape, device)
        and returned as is. Otherwise, with ``strict=True`` this raises; with
        ``strict=False`` host data is converted like ``TensorType.filter`` does
        and copied to the device.
        """
        if isinstance(data, Variable):
            raise TypeError(
                f"{self}: expected an array, got the symbolic variable {data}; call "
                "the function on values, not on (shared) variables"
            )
        if is_gpuarray(data):
            self._check_gpuarray(data)
            return data
        if strict:
            raise TypeError(
                f"{self}: strict filtering needs a pycuda GPUArray, got "
                f"{type(data).__name__}"
            )
        return to_gpu(
            self.filter_host(data, allow_downcast=allow_downcast), self.device
        )

    def _check_gpuarray(self, data: Any) -> None:
        dt = np.dtype(data.dtype)
        if dt != self.numpy_dtype:
            raise TypeError(
                f"{self}: the GPUArray has dtype {dt}, expected {self.dtype} (GPU "
                "values are never cast implicitly)"
            )
        shape = tuple(int(s) for s in data.shape)
        if len(shape) != self.ndim:
            raise TypeError(
                f"{self}: the GPUArray has {len(shape)} dims {shape}, expected "
                f"{self.ndim}"
            )
        if not _shapes_compatible(self.shape, shape):
            raise TypeError(
                f"{self}: the GPUArray's shape {shape} does not match the static shape "
                f"{self.shape}"
            )
        where = device_of(data)
        want = physical_index(self.device)
        if where is not None and where != want:
            raise TypeError(
                f"{self}: the GPUArray lives on physical device {where}, but device "
                f"label {self.device} is physical device {want}"
            )

    def is_valid_value(self, data: Any, strict: bool = True) -> bool:
        try:
            self.filter(data, strict=strict)
            return True
        except (TypeError, ValueError):
            return False

    @staticmethod
    def values_eq(a: Any, b: Any, force_same_dtype: bool = True) -> bool:
        """Exact equality, compared on the host (NaNs at the same places are equal)."""
        return bool(
            TensorType.values_eq(_host_value(a), _host_value(b), force_same_dtype)
        )

    @staticmethod
    def values_eq_approx(
        a: Any,
        b: Any,
        allow_remove_inf: bool = False,
        allow_remove_nan: bool = False,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> bool:
        """Approximate equality on the host, with TensorType's tolerances."""
        return bool(
            TensorType.values_eq_approx(
                _host_value(a), _host_value(b), allow_remove_inf, allow_remove_nan,
                rtol, atol,
            )
        )  # fmt: skip

    @staticmethod
    def may_share_memory(a: Any, b: Any) -> bool:
        """Whether two GPUArrays' device byte ranges overlap (numpy pairs: numpy's)."""
        if is_gpuarray(a) and is_gpuarray(b):
            ra, rb = _extent(a), _extent(b)
            if ra is None or rb is None:
                return False
            return ra[0] < rb[1] and rb[0] < ra[1]
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            return bool(np.may_share_memory(a, b))
        return False

    def get_shape_info(self, obj: Any) -> tuple[int, ...]:
        return tuple(obj.shape)

    def get_size(self, shape_info: tuple[int, ...]) -> int:
        return int(np.prod(shape_info, dtype=np.int64)) * self.numpy_dtype.itemsize

    # type relations
    def in_same_class(self, otype: Any) -> bool:
        return (
            isinstance(otype, CudaArrayType)
            and otype.dtype == self.dtype
            and otype.device == self.device
            and otype.broadcastable == self.broadcastable
        )

    def is_super(self, otype: Any) -> bool:
        """Whether ``otype`` is this type or a more shape-specific one, same device."""
        return (
            isinstance(otype, CudaArrayType)
            and otype.dtype == self.dtype
            and otype.device == self.device
            and otype.ndim == self.ndim
            and all(
                s is None or s == o
                for s, o in zip(self.shape, otype.shape, strict=True)
            )
        )

    def filter_variable(self, other: Any, allow_convert: bool = True) -> Variable:
        """``other`` as a variable of this type (see :meth:`convert_variable`)."""
        if not isinstance(other, Variable):
            other = self.constant_type(type=self, data=other)
        if other.type == self:
            return other
        if allow_convert:
            converted = self.convert_variable(other)
            if converted is not None:
                return converted
        raise TypeError(
            f"Cannot convert Type {other.type} (of Variable {other}) into Type {self}. "
            f"You can try to manually convert {other} into a {self}."
        )

    def convert_variable(self, var: Variable) -> Variable | None:
        """A variable compatible with this type made from ``var``, or ``None``.

        A GPU variable of a more specific type passes; one on another device
        gets a :class:`~cc2ops.cuda.transfer.GpuToGpu`. A host ``TensorType``
        variable with this dtype and number of dims becomes
        ``GpuFromHost(device)(var)`` (after ``specify_shape`` when this type's
        static shape is more specific), which is what lets a shared GPU
        parameter take a host update expression.
        """
        transfer = _transfer()
        vtype = var.type
        if isinstance(vtype, CudaArrayType):
            if self.is_super(vtype):
                return var
            if (
                vtype.dtype == self.dtype
                and vtype.ndim == self.ndim
                and (vtype.device != self.device)
            ):
                moved = transfer.gpu_to_gpu(var, self.device)
                return moved if self.is_super(moved.type) else None
            return None
        if (
            isinstance(vtype, TensorType)
            and vtype.dtype == self.dtype
            and (vtype.ndim == self.ndim)
        ):
            if any(
                s is not None and v is not None and s != v
                for s, v in zip(self.shape, vtype.shape, strict=True)
            ):
                return None
            host = var
            if not self._host_type.is_super(vtype):
                host = pt.specify_shape(var, self.shape)
            return transfer.GpuFromHost(self.device)(host)
        return None

    def __str__(self) -> str:
        shape = (
            "("
            + ", ".join(str(s) for s in self.shape)
            + ("," if self.ndim == 1 else "")
            + ")"
        )
        return f"CudaArrayType({self.dtype}, shape={shape}, device={self.device})"

    __repr__ = __str__


def is_gpu_variable(x: Any) -> bool:
    """Whether ``x`` is a graph variable of :class:`CudaArrayType`."""
    return isinstance(x, Variable) and isinstance(x.type, CudaArrayType)


class _CudaArrayOperators(_tensor_py_operators):
    """Tensor operators for GPU variables.

    PyTensor's operator mixin passes ``self`` to the tensor functions, which
    call ``as_tensor_variable`` on it; that is registered below to give
    ``host_from_gpu(self)``, so every expression builds a host graph.
    """

    def __iter__(self):
        return iter(_transfer().host_from_gpu(self))


class CudaArrayVariable(_CudaArrayOperators, Variable):
    """A graph variable of :class:`CudaArrayType`."""


class CudaArrayConstant(CudaArrayVariable, Constant):
    """A GPU constant that holds its data on the host until a GPU function is linked.

    Its type's static shape is the data's shape.
    """

    def __init__(self, type: CudaArrayType, data: Any, name: str | None = None) -> None:
        host = np.array(type.filter_host(data), copy=True)
        host.setflags(write=False)
        AtomicVariable.__init__(self, type.clone(shape=host.shape), name=name)
        self.data = host
        add_tag_trace(self)

    def signature(self) -> TensorConstantSignature:
        return TensorConstantSignature((self.type, self.data))


class CudaSharedVariable(CudaArrayVariable, SharedVariable):
    """A shared variable whose value lives on a CUDA device.

    It is created without touching CUDA: the container holds the host value
    (a numpy array) until a function using the variable is linked in the GPU
    mode, which uploads it. From then on the container holds a GPUArray and
    compiled updates replace it with GPUArrays.
    """

    def __init__(
        self,
        type: CudaArrayType,
        value: Any,
        strict: bool | None,
        allow_downcast: bool | None = None,
        container: Container | None = None,
        name: str | None = None,
    ) -> None:
        Variable.__init__(self, type=type, owner=None, index=None, name=name)
        if container is not None:
            if value is not None or strict is not None:
                raise TypeError(
                    "value and strict are ignored if you pass a container here"
                )
            self.container = container
        else:
            if is_gpuarray(value):
                stored = type.filter(value, strict=True)
            else:
                stored = type.filter_host(
                    value, strict=bool(strict), allow_downcast=allow_downcast
                )
            self.container = Container(
                self,
                storage=[stored],
                readonly=False,
                strict=bool(strict),
                allow_downcast=allow_downcast,
            )
        context = _sharedvalue.__SHARED_CONTEXT__
        if isinstance(context, list):
            context.append(self)
        self._default_update = None

    @property
    def is_uploaded(self) -> bool:
        """Whether the value is on the GPU (a GPUArray), not pending on the host."""
        return is_gpuarray(self.container.storage[0])

    def upload(self) -> None:
        """Copy a pending host value to the device (a no-op once uploaded)."""
        value = self.container.storage[0]
        if not is_gpuarray(value):
            self.container.storage[0] = to_gpu(value, self.type.device)

    def get_value(
        self, borrow: bool = False, return_internal_type: bool = False
    ) -> Any:
        """The value: numpy (downloaded or the pending host copy), or the GPUArray.

        Parameters
        ----------
        borrow : bool
            Allow returning the stored object itself instead of a copy.
        return_internal_type : bool
            Once uploaded, return a GPUArray (the stored one with
            ``borrow=True``, else a device copy) instead of numpy.
        """
        value = self.container.storage[0]
        if is_gpuarray(value):
            if return_internal_type:
                return value if borrow else copy(value, self.type.device)
            return to_host(value, self.type.device)
        return value if borrow else np.array(value, copy=True)

    def set_value(self, new_value: Any, borrow: bool = False) -> None:
        """Replace the value; a GPUArray or host data, before or after the upload.

        After the upload host data is copied to the device, so the variable
        stays on the GPU. A GPUArray is stored as is with ``borrow=True``, else
        copied.
        """
        if is_gpuarray(new_value):
            checked = self.type.filter(new_value, strict=True)
            self.container.storage[0] = (
                checked if borrow else copy(checked, self.type.device)
            )
            return
        host = self.type.filter_host(
            new_value,
            strict=self.container.strict,
            allow_downcast=self.container.allow_downcast,
        )
        if self.is_uploaded:
            self.container.storage[0] = to_gpu(host, self.type.device)
        else:
            self.container.storage[0] = host if borrow else np.array(host, copy=True)

    def clone(self, **kwargs: Any) -> CudaSharedVariable:
        cp = type(self)(
            name=kwargs.get("name", self.name),
            type=self.type,
            value=None,
            strict=None,
            container=self.container,
        )
        cp.tag = _copy.copy(self.tag)
        return cp


CudaArrayType.variable_type = CudaArrayVariable
CudaArrayType.constant_type = CudaArrayConstant


def shared(
    value: Any,
    device: int = 0,
    name: str | None = None,
    borrow: bool = False,
    shape: tuple[int | None, ...] | None = None,
) -> CudaSharedVariable:
    """A parameter that lives on a CUDA device; creating it never touches CUDA.

    Parameters
    ----------
    value : array-like or GPUArray
        The initial value. Host data is kept on the host until a GPU function
        using the variable is linked; its dtype is kept.
    device : int
        Device label.
    name : str, optional
    borrow : bool
        Keep ``value`` itself instead of a copy.
    shape : tuple of int or None, optional
        Static shape. Like ``pytensor.shared``, the default is unknown
        extents (``None`` per dim), since values may change shape.

    Returns
    -------
    CudaSharedVariable
    """
    if isinstance(value, Variable):
        raise TypeError(
            "cc2ops.cuda.shared: the value must be an array, not a symbolic variable"
        )
    if is_gpuarray(value):
        arr_shape = tuple(int(s) for s in value.shape)
        dtype = np.dtype(value.dtype)
        stored: Any = value if borrow else copy(value, device)
    else:
        arr = np.asarray(value)
        if not borrow:
            arr = np.array(arr, copy=True)
        arr_shape = arr.shape
        dtype = arr.dtype
        stored = arr
    static = (None,) * len(arr_shape) if shape is None else _parse_shape(shape)
    if not _shapes_compatible(static, arr_shape):
        raise ValueError(
            f"cc2ops.cuda.shared: shape {static} does not match the value's shape "
            f"{arr_shape}"
        )
    cuda_type = CudaArrayType(dtype, static, device)
    var = CudaSharedVariable(type=cuda_type, value=stored, strict=False, name=name)
    add_tag_trace(var)
    return var


@_as_tensor_variable.register(_CudaArrayOperators)
def _as_tensor_cuda(x, name, ndim, **kwargs):
    host = _transfer().host_from_gpu(x)
    return pt.as_tensor_variable(host, name=name, ndim=ndim, **kwargs)


def _parse_target(target: Any) -> int | None:
    """Device label of a target ``"cuda"``, ``"cuda1"``, ``"gpu0"``, else None."""
    if not isinstance(target, str):
        return None
    for prefix in ("cuda", "gpu"):
        if target.startswith(prefix):
            rest = target[len(prefix) :]
            if rest == "":
                return 0
            if rest.isdigit():
                return int(rest)
    return None


def _transfer_to_cuda(var: Any, target: Any) -> Variable | None:
    """``x.transfer("cuda1")``: the variable on device label 1."""
    label = _parse_target(target)
    if label is None:
        return None
    return _transfer().as_gpu(var, label)


register_transfer(_transfer_to_cuda)
