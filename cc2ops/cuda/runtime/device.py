"""CUDA devices: labels, contexts, streams, memory pools and a clean shutdown.

Labels and physical devices
---------------------------
Graphs name devices by an integer *label* (``CudaArrayType.device``). By
default label ``i`` is physical device ``i``. :func:`set_device_map` (or the
environment variable ``CC2OPS_DEVICE_MAP="0,0"``: label 0 -> physical 0,
label 1 -> physical 0) maps several labels onto one GPU, so multi-GPU graphs
can be built and run on a single GPU. Labels mapped to one physical device
share its context, stream and memory pool, so their arrays are
interchangeable. The map is plain Python: reading it never touches CUDA.

Per physical device there is exactly one of each:

``context``
    The device's primary context (the one the CUDA runtime, and therefore
    cuBLAS, uses), retained once.
``stream``
    A blocking pycuda ``Stream``: every cc2ops kernel, copy and cuBLAS call
    runs on it, so work on one device is ordered without synchronising.
``pool``
    A ``pycuda.tools.DeviceMemoryPool``: outputs are allocated from it, so a
    steady-state training step does not call ``cuMemAlloc``.

Context switching
-----------------
pycuda keeps its own context stack per thread. :meth:`Device.activate` makes
a device's context current cheaply: a thread-local record of the contexts
cc2ops pushed is consulted first, and the stack is only touched when the top
differs. ``activate`` replaces the top entry (the depth stays the same);
:meth:`Device.push`/:meth:`Device.pop` and :meth:`Device.using` nest. The
record assumes that code outside cc2ops which pushes a context pops it before
cc2ops runs again (pycuda's own scoped activations do).

Shutdown
--------
An ``atexit`` handler (registered when the first device is initialised)
synchronises every stream, runs the shutdown hooks of the other modules
(cuBLAS handles, loaded modules), returns held pool memory and stops the pools
holding freed blocks, then pops every context cc2ops pushed, so pycuda's
context stack is empty at interpreter exit ("context stack was not empty" is
an abort in pycuda). Contexts are not detached explicitly: GPUArrays still
alive at exit own a reference to their context through their allocation, and
pycuda releases the primary context when the last of them is freed; detaching
first would turn those frees into frees in a dead context.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.tape import note_alloc, recorder, refuse

__all__ = [
    "is_gpuarray",
    "device_of",
    "ptr",
    "Device",
    "PoolAllocator",
    "get_device",
    "set_device_map",
    "device_map",
    "physical_index",
    "initialized_devices",
    "current_physical",
    "release_thread",
    "register_shutdown_hook",
    "shutdown",
    "is_shut_down",
]

_log = logging.getLogger(__name__)

MAP_ENV = "CC2OPS_DEVICE_MAP"

_lock = threading.RLock()
_explicit_map: dict[int, int] | None = None
_env_map: dict[int, int] | None = None
_devices: dict[int, Device] = {}
_physicals: dict[int, _Physical] = {}
_shutdown_hooks: list[Callable[[], None]] = []
_atexit_registered = False
_shut_down = False
#: physical index -> the allocation list of a CUDA-graph capture in progress
#: (cc2ops.cuda.runtime.cudagraph): allocations made meanwhile are kept for the graph
_capture_holds: dict[int, list[Any]] = {}


class _ActiveContexts(threading.local):
    """The contexts cc2ops pushed on this thread's pycuda stack, bottom first."""

    def __init__(self) -> None:
        self.stack: list[_Physical] = []


_active = _ActiveContexts()


# --------------------------------------------------------------------------
# label -> physical device map (pure Python)
# --------------------------------------------------------------------------


def _check_label(label: Any, what: str = "device label") -> int:
    if isinstance(label, bool) or not isinstance(label, int):
        raise TypeError(
            f"cc2ops.cuda: {what} must be an int, got {type(label).__name__}"
        )
    if label < 0:
        raise ValueError(f"cc2ops.cuda: {what} must be >= 0, got {label}")
    return int(label)


def _parse_env_map(text: str) -> dict[int, int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"cc2ops.cuda: {MAP_ENV} must be a comma-separated list of physical "
            f"device indices (label i -> i-th entry), got {text!r}"
        ) from None
    if any(v < 0 for v in values):
        raise ValueError(f"cc2ops.cuda: {MAP_ENV} entries must be >= 0, got {text!r}")
    return dict(enumerate(values))


def _current_map() -> dict[int, int]:
    global _env_map
    if _explicit_map is not None:
        return _explicit_map
    if _env_map is None:
        text = os.environ.get(MAP_ENV, "").strip()
        _env_map = _parse_env_map(text) if text else {}
    return _env_map


def device_map() -> dict[int, int]:
    """The explicit label -> physical map (labels not in it map to themselves)."""
    return dict(_current_map())


def set_device_map(mapping: Mapping[int, int] | None) -> None:
    """Map device labels to physical devices, e.g. ``{0: 0, 1: 0}``.

    ``None`` goes back to ``CC2OPS_DEVICE_MAP`` / the identity. A label whose
    :class:`Device` already exists cannot be moved to another physical device
    (its arrays live there): that raises ``ValueError``.
    """
    global _explicit_map
    new: dict[int, int] | None = None
    if mapping is not None:
        new = {
            _check_label(k): _check_label(v, "physical device index")
            for k, v in dict(mapping).items()
        }
    with _lock:
        old = _explicit_map
        _explicit_map = new
        for label, dev in _devices.items():
            if physical_index(label) != dev.index:
                _explicit_map = old
                raise ValueError(
                    f"cc2ops.cuda: device label {label} is already in use on physical "
                    f"device {dev.index}; it cannot be remapped to "
                    f"{physical_index(label)} (set the map before using the device)"
                )


def physical_index(label: int) -> int:
    """The physical device index of ``label`` (no CUDA call)."""
    label = _check_label(label)
    return _current_map().get(label, label)


# --------------------------------------------------------------------------
# physical devices
# --------------------------------------------------------------------------


class PoolAllocator:
    """The allocator GPUArrays of one physical device are created with.

    Calling it allocates from the device's memory pool. It carries
    ``physical_index``, and pycuda passes an array's allocator on to its views
    and copies, so the device an array lives on can be read from the array.

    ``raw`` is the pool's own allocate: what a launch tape's replay
    (:mod:`cc2ops.cuda.runtime.tape`) allocates with, since it never records
    and never runs while a graph captures, the two things ``__call__`` adds.
    """

    __slots__ = ("physical_index", "_pool")

    def __init__(self, physical_index: int, pool: Any) -> None:
        self.physical_index = physical_index
        self._pool = pool

    @property
    def raw(self) -> Any:
        return self._pool.allocate

    def __call__(self, nbytes: int) -> Any:
        alloc = self._pool.allocate(nbytes)
        if recorder() is not None:
            note_alloc(alloc, nbytes)  # a temporary of the node being recorded
        if _capture_holds:
            held = _capture_holds.get(self.physical_index)
            if held is not None:
                held.append(alloc)  # a graph being captured will replay into it
        return alloc

    def __repr__(self) -> str:
        return f"PoolAllocator(physical_index={self.physical_index})"


class _Physical:
    """The CUDA objects of one physical device (created once, with CUDA)."""

    def __init__(self, index: int) -> None:
        drv = driver()
        count = drv.Device.count()
        if index >= count:
            raise ValueError(
                f"cc2ops.cuda: physical device {index} does not exist "
                f"({count} CUDA device(s) present; see set_device_map/{MAP_ENV})"
            )
        self.index = index
        self.cu_device = drv.Device(index)
        self.context = self.cu_device.retain_primary_context()
        # the stream and the pool bind to the context current when they are made
        _make_current(self)
        self.stream = drv.Stream()
        from pycuda.tools import DeviceMemoryPool

        self.pool = DeviceMemoryPool()
        self.allocator = PoolAllocator(index, self.pool)
        major, minor = self.cu_device.compute_capability()
        self.compute_capability = (int(major), int(minor))
        self.arch = f"sm_{major}{minor}"
        self.name = str(self.cu_device.name())
        attr = drv.device_attribute
        self.multiprocessors = int(
            self.cu_device.get_attribute(attr.MULTIPROCESSOR_COUNT)
        )
        optin = getattr(attr, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", None)
        if optin is None:
            optin = attr.MAX_SHARED_MEMORY_PER_BLOCK
        self.max_shared_per_block_optin = int(self.cu_device.get_attribute(optin))
        self.max_shared_per_block = int(
            self.cu_device.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK)
        )
        per_sm = getattr(attr, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", None)
        self.max_shared_per_multiprocessor = (
            int(self.cu_device.get_attribute(per_sm))
            if per_sm is not None
            else self.max_shared_per_block_optin
        )
        self.max_threads_per_multiprocessor = int(
            self.cu_device.get_attribute(attr.MAX_THREADS_PER_MULTIPROCESSOR)
        )
        _log.debug(
            "initialised %s (%s) as physical device %d", self.name, self.arch, index
        )


def _make_current(phys: _Physical) -> None:
    """Make ``phys``'s context the top of pycuda's stack, replacing cc2ops' top."""
    stack = _active.stack
    if stack and stack[-1] is phys:
        return
    drv = driver()
    if stack:
        drv.Context.pop()
        stack.pop()
    phys.context.push()
    stack.append(phys)


def release_thread() -> None:
    """Pop every context cc2ops pushed on the calling thread's pycuda stack.

    pycuda keeps one context stack per OS thread and aborts the whole process
    (``PyCUDA ERROR: The context stack was not empty``, then ``abort()``) when a
    thread ends with a context still on its stack. The ``atexit`` handler
    empties the main thread's stack; any other thread that made a device
    current (``activate``, ``push``, or any cc2ops call that launches or
    allocates) must call this before it ends, for example in a ``finally`` at
    the bottom of its target. A no-op on a thread that pushed nothing.

    Such a thread should not be the first to use a device (the device's
    stream and memory pool belong to the thread that makes them, and pycuda
    cannot free them from another one), and what it allocates outside the
    device's pool should be freed by the thread that keeps using the device
    (pycuda cannot free it on a thread with no context current).
    """
    stack = _active.stack
    if not stack:
        return
    drv = driver()
    while stack:
        drv.Context.pop()
        stack.pop()


class Device:
    """One device label and the physical device it maps to.

    Get instances with :func:`get_device` (memoised per label).

    Attributes
    ----------
    label : int
        The label graphs use (``CudaArrayType.device``).
    index : int
        The physical device index.
    context, stream, pool
        pycuda primary context, stream and ``DeviceMemoryPool`` of the
        physical device (shared by every label mapped to it).
    allocator : PoolAllocator
        Allocates from ``pool``; pass it as a GPUArray's ``allocator``.
    arch : str
        ``"sm_XY"`` from the compute capability, for nvcc.
    name : str
    multiprocessors : int
    max_shared_per_block, max_shared_per_block_optin : int
        Shared memory per block by default and with the opt-in attribute.
    max_shared_per_multiprocessor, max_threads_per_multiprocessor : int
        What one multiprocessor holds at once (see :meth:`resident_blocks`).
    """

    def __init__(self, label: int, physical: _Physical) -> None:
        self.label = label
        self._physical = physical

    # forwarded physical attributes
    @property
    def index(self) -> int:
        return self._physical.index

    @property
    def context(self) -> Any:
        return self._physical.context

    @property
    def stream(self) -> Any:
        return self._physical.stream

    @property
    def pool(self) -> Any:
        return self._physical.pool

    @property
    def allocator(self) -> PoolAllocator:
        return self._physical.allocator

    @property
    def arch(self) -> str:
        return self._physical.arch

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self._physical.compute_capability

    @property
    def name(self) -> str:
        return self._physical.name

    @property
    def multiprocessors(self) -> int:
        return self._physical.multiprocessors

    @property
    def max_shared_per_block(self) -> int:
        return self._physical.max_shared_per_block

    @property
    def max_shared_per_block_optin(self) -> int:
        return self._physical.max_shared_per_block_optin

    @property
    def max_shared_per_multiprocessor(self) -> int:
        return self._physical.max_shared_per_multiprocessor

    @property
    def max_threads_per_multiprocessor(self) -> int:
        return self._physical.max_threads_per_multiprocessor

    def resident_blocks(self, threads: int, shared_bytes: int) -> int:
        """Blocks of ``threads`` threads and ``shared_bytes`` of dynamic shared
        memory that one multiprocessor holds at once, by threads and shared
        memory (registers not counted; at least 1).

        Each resident block also takes 1 KiB of shared memory that the driver
        reserves for it (sm_80 and later).
        """
        by_threads = self.max_threads_per_multiprocessor // max(1, int(threads))
        by_smem = self.max_shared_per_multiprocessor // (int(shared_bytes) + 1024)
        return max(1, min(by_threads, by_smem, 32))

    def shares_physical(self, other: Device) -> bool:
        """Whether ``other`` is the same physical device (same context)."""
        return self._physical is other._physical

    # contexts
    def activate(self) -> None:
        """Make this device's context current (a no-op when it already is)."""
        stack = _active.stack
        if stack and stack[-1] is self._physical:
            return
        _make_current(self._physical)

    def push(self) -> None:
        """Push this device's context over the current one (pair with :meth:`pop`)."""
        driver()
        self._physical.context.push()
        _active.stack.append(self._physical)

    def pop(self) -> None:
        """Pop this device's context, pushed by :meth:`push`."""
        stack = _active.stack
        if not stack or stack[-1] is not self._physical:
            top = f"physical device {stack[-1].index}" if stack else "nothing"
            raise RuntimeError(
                f"cc2ops.cuda: Device.pop: the current cc2ops context is {top}, not "
                f"physical device {self.index}"
            )
        driver().Context.pop()
        stack.pop()

    @contextmanager
    def using(self) -> Iterator[Device]:
        """``with dev.using():`` runs the block with this device current, then restores
        the previous one."""
        depth = len(_active.stack)
        self.push()
        try:
            yield self
        finally:
            drv = driver()
            stack = _active.stack
            while len(stack) > depth:
                drv.Context.pop()
                stack.pop()

    # memory and synchronisation
    def alloc(self, nbytes: int) -> Any:
        """``nbytes`` of device memory from the pool (a ``PooledDeviceAllocation``)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(
                f"Device.alloc: nbytes must be an int >= 0, got {nbytes!r}"
            )
        # through the allocator: a graph capture holds it, a tape records it
        return self._physical.allocator(nbytes)

    def synchronize(self) -> None:
        """Wait until all work queued on this device's stream has finished."""
        refuse("a synchronisation")
        self.activate()
        self._physical.stream.synchronize()

    def __repr__(self) -> str:
        return (
            f"Device(label={self.label}, index={self.index}, name={self.name!r}, "
            f"arch={self.arch!r})"
        )


def is_gpuarray(x: Any) -> bool:
    """Whether ``x`` looks like a pycuda GPUArray (gpudata, shape, dtype, strides)."""
    return (
        hasattr(x, "gpudata")
        and hasattr(x, "shape")
        and hasattr(x, "dtype")
        and hasattr(x, "strides")
    )


def device_of(garray: Any) -> int | None:
    """The physical device index of ``garray``, or ``None`` when unknown."""
    alloc = getattr(garray, "allocator", None)
    if isinstance(alloc, PoolAllocator):
        return alloc.physical_index
    return None


def ptr(garray: Any) -> int:
    """The device address of ``garray``'s first element (0 for an empty array)."""
    data = garray.gpudata
    return 0 if data is None else int(data)


def get_device(label: int) -> Device:
    """The :class:`Device` for ``label`` (memoised); initialises CUDA on first use.

    Raises
    ------
    CudaUnavailableError
        Without pycuda, a driver or a device.
    ValueError
        If the label maps to a physical device that does not exist.
    """
    global _atexit_registered
    label = _check_label(label)
    dev = _devices.get(label)
    if dev is not None:
        return dev
    with _lock:
        if _shut_down:
            raise RuntimeError("cc2ops.cuda: the CUDA runtime has been shut down")
        dev = _devices.get(label)
        if dev is not None:
            return dev
        index = physical_index(label)
        phys = _physicals.get(index)
        if phys is None:
            phys = _Physical(index)
            _physicals[index] = phys
            if not _atexit_registered:
                atexit.register(shutdown)
                _atexit_registered = True
        dev = Device(label, phys)
        _devices[label] = dev
        return dev


def current_physical() -> int | None:
    """The physical index of the context cc2ops made current on this thread, if any."""
    stack = _active.stack
    return stack[-1].index if stack else None


def initialized_devices() -> list[Device]:
    """The devices created so far (CUDA untouched when there are none)."""
    return list(_devices.values())


def _physical_devices() -> list[_Physical]:
    return list(_physicals.values())


def register_shutdown_hook(hook: Callable[[], None]) -> None:
    """Run ``hook()`` at shutdown, before pools are emptied and contexts popped.

    Hooks run in reverse order of registration, with CUDA still usable; a
    hook that raises is logged and skipped.
    """
    _shutdown_hooks.append(hook)


def is_shut_down() -> bool:
    """Whether :func:`shutdown` has run."""
    return _shut_down


def shutdown() -> None:
    """Synchronise, free, and pop every context cc2ops pushed (idempotent).

    Registered with ``atexit``; call it directly only at the very end of a
    program. Arrays freed afterwards go straight back to the driver.
    """
    global _shut_down
    with _lock:
        if _shut_down:
            return
        _shut_down = True
        if not _physicals:
            return
        drv = driver()
        for phys in _physicals.values():
            try:
                _make_current(phys)
                phys.stream.synchronize()
            except Exception as e:  # a failed kernel must not stop the cleanup
                _log.debug(
                    "shutdown: synchronising device %d failed: %s", phys.index, e
                )
        for hook in reversed(_shutdown_hooks):
            try:
                hook()
            except Exception as e:
                _log.debug("shutdown hook %r failed: %s", hook, e)
        for phys in _physicals.values():
            try:
                phys.pool.free_held()
                phys.pool.stop_holding()
            except Exception as e:
                _log.debug(
                    "shutdown: freeing the pool of device %d failed: %s", phys.index, e
                )
        stack = _active.stack
        while stack:
            try:
                drv.Context.pop()
            except Exception as e:
                _log.debug("shutdown: popping a context failed: %s", e)
            stack.pop()
