"""GPU arrays for cc2ops: ``pycuda.gpuarray.GPUArray`` from the device pools.

GPU values at run time are ``pycuda.gpuarray.GPUArray`` objects, possibly
non-contiguous views (a view keeps its parent alive through ``base``). The
helpers here are what GPU ops use:

- :func:`empty`, :func:`zeros` allocate C-contiguous arrays from the device's
  memory pool (never a ``cuMemAlloc`` per op call in steady state);
- :func:`to_gpu` / :func:`to_host` copy between numpy and the device on the
  device's stream (``to_host`` synchronises before it returns);
- :func:`is_c_contiguous`, :func:`ascontiguous`, :func:`copy` handle strided
  views with a copy kernel (``kernels/copy.cu``) or a device memcpy;
- :func:`fill` writes a value with ``kernels/fill.cu``; :func:`ptr` is the
  device address of element 0 (offset included), for kernel arguments.

The device of an array is read from its allocator (:func:`device_of`); arrays
allocated elsewhere (plain ``pycuda.gpuarray.to_gpu``) have an unknown device
and are trusted to be on the device they are used with.

With ``CC2OPS_DEBUG=1``, :func:`empty` poisons new memory (NaN for floats,
all bits set otherwise) so that reads of unwritten outputs show up in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from cc2ops.cuda.runtime import checks
from cc2ops.cuda.runtime.compile import (
    debug_enabled,
    get_kernel,
    launch,
    register_namer,
    register_variants,
)

# is_gpuarray, device_of and ptr live in device.py (compile needs them to pack
# kernel arguments, and this module launches kernels); re-exported here
from cc2ops.cuda.runtime.device import device_of, get_device, is_gpuarray, ptr
from cc2ops.cuda.runtime.tape import note_driver, refuse

__all__ = [
    "view",
    "flat_view",
    "SUPPORTED_KINDS",
    "COPY_MAX_DIMS",
    "is_gpuarray",
    "device_of",
    "ptr",
    "empty",
    "zeros",
    "full",
    "to_gpu",
    "to_host",
    "is_c_contiguous",
    "ascontiguous",
    "copy",
    "fill",
]

#: numpy dtype kinds a GPU array may have: bool, ints, unsigned, float, complex.
SUPPORTED_KINDS = "biufc"
#: The most (merged) dimensions the strided copy kernel handles.
COPY_MAX_DIMS = 12
_UNITS = (1, 2, 4, 8)
_BLOCK = 256


@register_namer("copy")
def _copy_name(unit: int, maxdim: int, **_: Any) -> str:
    return f"copy_u{unit}_d{maxdim}"


@register_namer("fill")
def _fill_name(unit: int, **_: Any) -> str:
    return f"fill_u{unit}"


@register_variants("copy")
def _copy_variants() -> list[dict[str, Any]]:
    return [
        {"name": _copy_name(u, COPY_MAX_DIMS), "unit": u, "maxdim": COPY_MAX_DIMS}
        for u in _UNITS
    ]


@register_variants("fill")
def _fill_variants() -> list[dict[str, Any]]:
    return [{"name": _fill_name(u), "unit": u} for u in _UNITS]


def _check_dtype(where: str, dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in SUPPORTED_KINDS:
        raise TypeError(
            f"{where}: dtype {dt} is not supported on the GPU (numeric and bool only)"
        )
    return dt


def _check_shape(where: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(
            f"{where}: shape must be a tuple of ints, got {shape!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{where}: shape must not have negative extents, got {dims}")
    return dims


def _poison(garray: Any, device: int) -> None:
    if garray.dtype.kind in "fc":
        fill(garray, np.nan, device=device)
    else:
        fill(garray, np.array(-1).astype(garray.dtype), device=device)


def empty(shape: Sequence[int] | int, dtype: Any, device: int) -> Any:
    """An uninitialised C-contiguous GPUArray from ``device``'s memory pool.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : numpy dtype-like
        Any bool, integer, float or complex dtype.
    device : int
        Device label.
    """
    dims = _check_shape("empty", shape)
    dt = _check_dtype("empty", dtype)
    dev = get_device(device)
    dev.activate()
    from pycuda.gpuarray import GPUArray

    out = GPUArray(dims, dt, allocator=dev.allocator)
    if debug_enabled() and out.size:
        _poison(out, device)
    return out


def zeros(shape: Sequence[int] | int, dtype: Any, device: int) -> Any:
    """A zero-filled C-contiguous GPUArray from ``device``'s pool (async memset)."""
    out = empty(shape, dtype, device)
    if out.nbytes:
        dev = get_device(device)
        from cc2ops.cuda.runtime.availability import driver

        args = (ptr(out), 0, out.nbytes, dev.stream)
        driver().memset_d8_async(*args)
        note_driver("memset_d8_async", args, (0,))
    return out


def full(shape: Sequence[int] | int, value: Any, dtype: Any, device: int) -> Any:
    """A C-contiguous GPUArray of ``value`` (cast to ``dtype``)."""
    out = empty(shape, dtype, device)
    fill(out, value, device=device)
    return out


def to_gpu(array: Any, device: int) -> Any:
    """Copy a numpy array (any strides) to a new C-contiguous GPUArray on ``device``.

    The copy is queued on the device's stream; the host array may be reused
    as soon as this returns (pageable host memory is staged by the driver).
    """
    host = np.asarray(array, order="C")
    _check_dtype("to_gpu", host.dtype)
    refuse("an upload from the host")
    out = empty(host.shape, host.dtype, device)
    if host.nbytes:
        dev = get_device(device)
        from cc2ops.cuda.runtime.availability import driver

        driver().memcpy_htod_async(ptr(out), host, dev.stream)
    return out


def _device_label_for(garray: Any, device: int | None) -> int:
    if device is not None:
        return device
    where = device_of(garray)
    if where is not None:
        return where_label(where)
    # an array from another allocator: assume the device cc2ops made current
    from cc2ops.cuda.runtime.device import current_physical

    current = current_physical()
    return 0 if current is None else where_label(current)


def where_label(physical: int) -> int:
    """A device label that maps to ``physical`` (an initialised one if possible)."""
    from cc2ops.cuda.runtime.device import initialized_devices, physical_index

    for dev in initialized_devices():
        if dev.index == physical:
            return dev.label
    if physical_index(physical) == physical:
        return physical
    raise ValueError(f"cc2ops.cuda: no device label maps to physical device {physical}")


def to_host(garray: Any, device: int | None = None) -> np.ndarray:
    """Copy a GPUArray (any strides) into a new C-contiguous numpy array.

    Synchronises the device's stream before returning, so the result is
    complete. ``device`` defaults to the array's own device.
    """
    if isinstance(garray, np.ndarray):
        return np.asarray(garray, order="C")
    if not is_gpuarray(garray):
        raise TypeError(f"to_host: expected a GPUArray, got {type(garray).__name__}")
    refuse("a read-back to the host")
    label = _device_label_for(garray, device)
    src = ascontiguous(garray, label)
    host = np.empty(src.shape, src.dtype)
    dev = get_device(label)
    dev.activate()
    if host.nbytes:
        from cc2ops.cuda.runtime.availability import driver

        driver().memcpy_dtoh_async(host, ptr(src), dev.stream)
    dev.stream.synchronize()
    if checks.pending():
        # the device has passed every deferred flag copy on this stream; the
        # values returned may go on to change host state: check them first
        checks.flush()
    return host


def is_c_contiguous(garray: Any) -> bool:
    """Whether ``garray`` is in C order without gaps (extent-1 axes ignored)."""
    shape = tuple(garray.shape)
    if 0 in shape:
        return True
    expected = np.dtype(garray.dtype).itemsize
    for n, s in zip(reversed(shape), reversed(tuple(garray.strides)), strict=True):
        if n == 1:
            continue
        if s != expected:
            return False
        expected *= n
    return True


def _geometry(garray: Any) -> tuple[int, list[int], list[int]]:
    """(unit, extents, strides in units) of ``garray``'s elements, dims merged."""
    itemsize = np.dtype(garray.dtype).itemsize
    dims = [
        (int(n), int(s))
        for n, s in zip(garray.shape, garray.strides, strict=True)
        if n != 1
    ]
    merged: list[tuple[int, int]] = []
    for n, s in dims:
        # an axis merges into the previous (outer) one when the outer stride
        # steps exactly over the inner axis
        if merged and merged[-1][1] == s * n:
            n_outer, _ = merged[-1]
            merged[-1] = (n_outer * n, s)
        else:
            merged.append((n, s))
    base = ptr(garray)
    unit = next(
        u
        for u in reversed(_UNITS)
        if itemsize % u == 0 and base % u == 0 and all(s % u == 0 for _, s in merged)
    )
    extents = [n for n, _ in merged]
    strides = [s // unit for _, s in merged]
    if itemsize > unit:
        extents.append(itemsize // unit)
        strides.append(1)
    return unit, extents, strides


def _copy_into_contiguous(src: Any, dst: Any, device: int) -> None:
    """Copy ``src`` (any strides) into the C-contiguous ``dst`` of the same shape."""
    if not src.size:
        return
    dev = get_device(device)
    if is_c_contiguous(src):
        from cc2ops.cuda.runtime.availability import driver

        dev.activate()
        args = (ptr(dst), ptr(src), src.nbytes, dev.stream)
        driver().memcpy_dtod_async(*args)
        note_driver("memcpy_dtod_async", args, (0, 1))
        return
    unit, extents, strides = _geometry(src)
    if len(extents) > COPY_MAX_DIMS:
        raise ValueError(
            f"cc2ops.cuda: a strided copy of shape {tuple(src.shape)} with strides "
            f"{tuple(src.strides)} needs {len(extents)} dimensions after merging; the "
            f"copy kernel handles {COPY_MAX_DIMS}"
        )
    n = prod(extents)
    pad = COPY_MAX_DIMS - len(extents)
    geometry: list[Any] = []
    for e, s in zip(extents + [1] * pad, strides + [0] * pad, strict=True):
        geometry += [np.int64(e), np.int64(s)]
    consts = {
        "name": _copy_name(unit, COPY_MAX_DIMS),
        "unit": unit,
        "maxdim": COPY_MAX_DIMS,
    }
    fn = get_kernel("copy", device, **consts)
    grid = min((n + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 32)
    launch(
        fn, grid, _BLOCK,
        [src, dst, np.int64(n), np.int64(len(extents)), *geometry],
        device,
    )  # fmt: skip


def ascontiguous(garray: Any, device: int | None = None) -> Any:
    """``garray`` itself if C-contiguous, else a C-contiguous copy on its device."""
    if is_c_contiguous(garray):
        return garray
    label = _device_label_for(garray, device)
    out = empty(garray.shape, garray.dtype, label)
    _copy_into_contiguous(garray, out, label)
    return out


def copy(garray: Any, device: int | None = None) -> Any:
    """A new C-contiguous GPUArray with ``garray``'s values (a distinct buffer)."""
    label = _device_label_for(garray, device)
    out = empty(garray.shape, garray.dtype, label)
    _copy_into_contiguous(garray, out, label)
    return out


def fill(garray: Any, value: Any, device: int | None = None) -> Any:
    """Set every element of the C-contiguous ``garray`` to ``value``; returns it."""
    if not is_c_contiguous(garray):
        raise ValueError(
            "fill: the array must be C-contiguous, got strides "
            f"{tuple(garray.strides)} "
            f"for shape {tuple(garray.shape)}"
        )
    if not garray.size:
        return garray
    dt = np.dtype(garray.dtype)
    pattern = np.array(value).astype(dt).reshape(()).tobytes()
    label = _device_label_for(garray, device)
    base = ptr(garray)
    unit = next(u for u in reversed(_UNITS) if dt.itemsize % u == 0 and base % u == 0)
    words = np.frombuffer(pattern, dtype=f"<u{unit}")
    period = len(words)
    if period > 2:
        # a 16-byte element is two 8-byte words; narrower words mean a
        # misaligned view, which the fill kernel does not handle
        raise ValueError(
            f"fill: cannot fill a {dt} array at address {base:#x} (misaligned)"
        )
    p0 = int(words[0])
    p1 = int(words[1]) if period == 2 else p0
    n = garray.nbytes // unit
    dev = get_device(label)
    fn = get_kernel("fill", label, **{"name": _fill_name(unit), "unit": unit})
    grid = min((n + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 32)
    launch(
        fn, grid, _BLOCK,
        [garray, np.int64(n), np.uint64(p0), np.uint64(p1), np.int64(period)],
        label,
    )  # fmt: skip
    return garray


def view(base: Any, offset: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    """A GPUArray view of ``base``'s buffer: element offset, shape, element strides.

    The view keeps ``base`` alive; nothing is checked against ``base``'s size
    (workspace carving: the caller planned the layout).
    """
    from pycuda.gpuarray import GPUArray  # pycuda is optional: imported on use

    item = np.dtype(base.dtype).itemsize
    return GPUArray(
        tuple(int(s) for s in shape),
        base.dtype,
        allocator=base.allocator,
        base=base,
        gpudata=ptr(base) + int(offset) * item,
        strides=tuple(int(s) * item for s in strides),
    )


def flat_view(base: Any, offset: int, shape: Sequence[int]) -> Any:
    """A C-contiguous :func:`view` of ``prod(shape)`` elements of ``base`` from
    element ``offset``."""
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= int(s)
    return view(base, offset, shape, tuple(reversed(strides)))
