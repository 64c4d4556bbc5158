"""Launch tapes: a node's device work recorded once, replayed with new pointers.

An eager GPU step spends most of its time on the host: each node's ``perform``
checks its inputs, works out a launch plan, allocates its outputs and packs
kernel arguments, 60-500 us per node in Python, for kernels that often run
for less. Yet for inputs of one geometry a node queues the same work every
call; only the device addresses change. A *tape* is that work written down:

- the kernel launches (function, grid, block, shared memory, stream and the
  packed arguments), device-to-device copies and memsets, cuBLAS calls, and
  the host calls a replay must make again (:func:`note_call`: a deferred
  label check registering the flag just written), in order;
- the temporaries allocated from the device pool while ``perform`` ran;
- each output, as an input passed through, a view of an input, or a view of
  a temporary;

with every device pointer written as *(slot, byte offset)*, a slot being one
of the node's GPU inputs or one of the temporaries. Replaying a tape
allocates the temporaries again, adds the new base addresses to the offsets
and queues the same work, with no Python checks; the outputs are GPUArrays
built from a template of the recorded ones.

What makes replaying sound
--------------------------
A tape is only ever replayed for a call whose *key* equals the key of the
calls it was recorded from (:meth:`NodeTapes.key`): every GPU input's shape,
strides and address alignment (mod 256), which inputs share an address, the
values of the node's small host inputs (shapes, indices, scalars) and the
TF32 switch (:func:`cc2ops.cuda.runtime.precision.get_allow_tf32`, read when
a product runs). Beyond the key, ``perform`` must depend on nothing that
changes between calls; a tape is made only from **two consecutive calls that
recorded the same work**, so per-call state (a random seed passed to a
kernel, an autotuner still timing candidates, a lazily created handle)
shows as a difference and keeps the node on ``perform``.

Recording is passive: ``perform`` runs as usual, and the runtime's entry
points report to the active :class:`Recorder` (this thread's): the
launcher (:func:`cc2ops.cuda.runtime.compile.launch`), the pool allocator
(:class:`cc2ops.cuda.runtime.device.PoolAllocator`), the copies and memsets
of :mod:`cc2ops.cuda.runtime.array`, and cuBLAS's compute calls
(:mod:`cc2ops.cuda.libs.cublas`). Everything else that touches the device
from ``perform`` *refuses* the recording (:func:`refuse`): uploads,
read-backs, synchronisation, collectives, the autotuner's timing runs. A
recording is refused as well when

- a kernel pointer argument points outside every slot (a buffer kept from an
  earlier call, which a replay could not know is still valid);
- a pointer falls inside two inputs that do not start at the same address;
- an output is not a GPUArray (a host result) or lies outside every slot;
- the node's device is being captured into a CUDA graph.

Only GPU ops that declare ``tape_replay = True`` are taped
(:class:`cc2ops.cuda.op.GpuOp`): their ``perform`` does all its device work
through the entry points above and keeps no per-call host state.

Nothing here touches CUDA at import, and nothing imports PyTensor.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Recorder",
    "Tape",
    "NodeTapes",
    "recorder",
    "refuse",
    "set_enabled",
    "enabled",
    "note_alloc",
    "note_launch",
    "note_driver",
    "note_library",
    "note_call",
    "note_host_scalar",
    "MAX_TAPES_PER_NODE",
    "MAX_RECORDINGS",
    "HOST_KEY_MAX_ELEMENTS",
]

#: Input geometries a node keeps tapes for (least recently used dropped first).
MAX_TAPES_PER_NODE = 8
#: Recordings of one key after which a node stops trying and stays on perform.
MAX_RECORDINGS = 4
#: A host input with more elements than this keeps the node on ``perform``
#: (its value is part of the key, and hashing a large array costs more than
#: the tape saves).
HOST_KEY_MAX_ELEMENTS = 64
#: Device addresses are above this; smaller integer arguments are never
#: taken for pointers.
_MIN_ADDRESS = 1 << 32
_ALIGN_MASK = 255


class _State(threading.local):
    rec: Recorder | None = None


_state = _State()
_enabled = True


def set_enabled(flag: bool) -> None:
    """Turn tape replay on (the default) or off for every node; off, each call
    runs ``perform`` (to compare, or to rule tapes out when debugging)."""
    global _enabled
    if not isinstance(flag, bool):
        raise TypeError(f"tape.set_enabled: flag must be a bool, got {flag!r}")
    _enabled = flag


def enabled() -> bool:
    """Whether tape replay is on."""
    return _enabled


def recorder() -> Recorder | None:
    """The recorder active on this thread, if any."""
    return _state.rec


def refuse(reason: str) -> None:
    """Mark the active recording (if any) as not replayable, for ``reason``.

    Called by every runtime entry point that does device work a tape cannot
    hold: an upload, a read-back, a synchronisation, a collective.
    """
    rec = _state.rec
    if rec is not None and rec.refused is None:
        rec.refused = reason


def note_alloc(alloc: Any, nbytes: int) -> None:
    """A pool allocation of ``nbytes`` made while recording (a temporary slot)."""
    rec = _state.rec
    if rec is not None:
        rec.alloc(alloc, nbytes)


def note_launch(
    fn: Any,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared: int,
    stream: Any,
    values: Sequence[Any],
    pointers: Sequence[int],
    fmt: str,
) -> None:
    """A kernel launch as the launcher packed it: ``values[i]`` for ``i`` in
    ``pointers`` are device addresses (arrays and allocations), the others
    numpy scalars."""
    rec = _state.rec
    if rec is not None:
        rec.launch(fn, grid, block, shared, stream, values, pointers, fmt)


def note_driver(name: str, args: Sequence[Any], pointers: Sequence[int]) -> None:
    """A call ``driver().<name>(*args)`` (a copy or memset) whose arguments at
    positions ``pointers`` are device addresses."""
    rec = _state.rec
    if rec is not None:
        rec.driver_call(name, args, pointers)


def note_library(call: Callable[..., Any], name: str, args: Sequence[Any]) -> None:
    """A library call ``call(name, *args)`` (cuBLAS): integer arguments that
    fall in a slot are device pointers, those that are the address of a
    :func:`note_host_scalar` array are host scalars, the rest constants."""
    rec = _state.rec
    if rec is not None:
        rec.library_call(call, name, args)


def note_call(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """A host function ``fn(*args)`` a replay must call again at this point
    (a deferred check that registers the flag just written): GPU array
    arguments are rebuilt over the replay's buffers, the others are kept.
    ``fn`` must be safe to call with the arrays of any later call."""
    rec = _state.rec
    if rec is not None:
        rec.call(fn, args)


def note_host_scalar(array: np.ndarray) -> None:
    """A host array whose address a following library call takes (cuBLAS's
    ``alpha``/``beta``); the tape keeps a copy of it."""
    rec = _state.rec
    if rec is not None:
        rec.host_scalar(array)


def _span(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple:
    """(lowest, highest + itemsize) byte offsets an array's elements cover."""
    lo = hi = 0
    for n, s in zip(shape, strides, strict=True):
        if n > 1:
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
    return lo, hi + itemsize


def _scalar_sig(value: Any) -> tuple:
    return (type(value), np.asarray(value).tobytes())


def _array_template(a: Any, fields: frozenset[str] | None) -> dict[str, Any]:
    """A GPU array's attributes among ``fields`` (all when ``None``) but its
    buffer (``gpudata``, ``base``): what a replay builds a new array from."""
    t = {f: v for f, v in vars(a).items() if fields is None or f in fields}
    t.pop("gpudata", None)
    t.pop("base", None)
    return t


class Recorder:
    """The device work of one ``perform``, with pointers as (slot, offset).

    Parameters
    ----------
    inputs : sequence
        The node's input values; ``gpu[i]`` says whether input ``i`` is a GPU
        array (its slot is ``i``; host inputs have no slot).
    gpu : sequence of bool
    """

    def __init__(
        self,
        inputs: Sequence[Any],
        gpu: Sequence[bool],
        fields: frozenset[str] | None = None,
    ) -> None:
        self.inputs = list(inputs)
        self.fields = fields
        self.n_in = len(self.inputs)
        # (lo, hi, base) byte ranges per GPU input
        self._in_ranges: list[tuple[int, int, int, int]] = []
        self.bases: list[int] = [0] * self.n_in
        for i, (v, is_gpu) in enumerate(zip(self.inputs, gpu, strict=True)):
            if not is_gpu:
                continue
            base = int(v.gpudata)
            lo, hi = _span(v.shape, v.strides, np.dtype(v.dtype).itemsize)
            self._in_ranges.append((base + lo, base + hi, base, i))
            self.bases[i] = base
        #: (address, nbytes) of each temporary, in allocation order
        self.temps: list[tuple[int, int]] = []
        self.actions: list[tuple] = []
        self._host: dict[int, np.ndarray] = {}
        self.host_copies: list[np.ndarray] = []
        self.refused: str | None = None

    # -- where a pointer lives ---------------------------------------------

    def locate(self, p: int) -> tuple[int, int] | None:
        """(slot, offset) of address ``p``: the latest temporary holding it, else
        the input(s) holding it; ``None`` when it is in no slot. Slots count
        the inputs first, then the temporaries."""
        for j in range(len(self.temps) - 1, -1, -1):
            base, n = self.temps[j]
            if base <= p < base + n:
                return self.n_in + j, p - base
        hits = [r for r in self._in_ranges if r[0] <= p < r[1]]
        if not hits:
            # a pointer one past an input's end (an empty tail view)
            hits = [r for r in self._in_ranges if p == r[1]]
            if not hits:
                return None
        base = hits[0][2]
        if any(r[2] != base for r in hits[1:]):
            self.refuse(
                f"address {p:#x} lies in inputs {[r[3] for r in hits]}, which start "
                "at different addresses"
            )
            return None
        return hits[0][3], p - base

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = reason

    # -- what perform reports -----------------------------------------------

    def alloc(self, alloc: Any, nbytes: int) -> None:
        if nbytes > 0:
            self.temps.append((int(alloc), int(nbytes)))

    def call(self, fn: Callable[..., Any], args: Sequence[Any]) -> None:
        consts: list[Any] = []
        arrays: list[tuple[int, int, int]] = []
        sig: list[Any] = []
        for i, a in enumerate(args):
            if hasattr(a, "gpudata") and hasattr(a, "strides"):
                loc = self.locate(int(a.gpudata))
                if loc is None:
                    self.refuse(
                        f"{getattr(fn, '__name__', fn)}: argument {i} "
                        f"({int(a.gpudata):#x}) is outside the node's inputs and "
                        "temporaries"
                    )
                    return
                template = _array_template(a, self.fields)
                arrays.append((i, *loc))
                consts.append((type(a), template))
                sig.append(("a", type(a), template, *loc))
            else:
                consts.append(a)
                sig.append(("c", type(a), a))
        self.actions.append(("call", (fn, tuple(sig), tuple(arrays)), consts))

    def launch(self, fn, grid, block, shared, stream, values, addresses, fmt) -> None:
        if getattr(fn, "texrefs", None):
            self.refuse("a kernel with texture references")
            return
        consts: list[Any] = list(values)
        pointers: list[tuple[int, int, int]] = []
        addresses = set(addresses)
        for i, v in enumerate(values):
            t = type(v)
            if i in addresses:
                loc = self.locate(int(v))
                if loc is None:
                    self.refuse(
                        f"argument {i} of {getattr(fn, '_cc2ops_name', 'a kernel')} "
                        f"points at {int(v):#x}, outside the node's inputs and "
                        "temporaries"
                    )
                    return
                pointers.append((i, *loc))
                consts[i] = None
            elif t in (np.uint64, np.int64) and int(v) >= _MIN_ADDRESS:
                # an address passed as a 64-bit integer: a pointer if it is in a slot
                loc = self.locate(int(v))
                if loc is not None:
                    pointers.append((i, *loc))
                    consts[i] = None
        sig = tuple(None if c is None else _scalar_sig(c) for c in consts)
        self.actions.append(
            ("launch", (fn, grid, block, shared, stream, fmt, sig, tuple(pointers)),
             consts)
        )  # fmt: skip

    def driver_call(self, name: str, args: Sequence[Any], pointers: Sequence[int]):
        consts: list[Any] = list(args)
        where: list[tuple[int, int, int]] = []
        for i in pointers:
            loc = self.locate(int(args[i]))
            if loc is None:
                self.refuse(
                    f"{name}: argument {i} ({int(args[i]):#x}) is outside the node's "
                    "inputs and temporaries"
                )
                return
            where.append((i, *loc))
            consts[i] = None
        sig = tuple(
            None if c is None else (c if not isinstance(c, int) else ("i", c))
            for c in consts
        )
        self.actions.append(("driver", (name, sig, tuple(where)), consts))

    def host_scalar(self, array: np.ndarray) -> None:
        self._host[int(array.ctypes.data)] = array

    def library_call(self, call: Callable[..., Any], name: str, args: Sequence[Any]):
        consts: list[Any] = list(args)
        where: list[tuple[int, int, int]] = []
        host: list[tuple[int, int]] = []
        sig: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                a = int(a)
                kept = self._host.get(a)
                if kept is not None:
                    host.append((i, len(self.host_copies)))
                    self.host_copies.append(np.array(kept, copy=True))
                    sig.append(("h", kept.dtype.str, kept.tobytes()))
                    consts[i] = None
                    continue
                if a >= _MIN_ADDRESS:
                    loc = self.locate(a)
                    if loc is not None:
                        where.append((i, *loc))
                        sig.append(("p", *loc))
                        consts[i] = None
                        continue
                sig.append(("i", a))
            else:
                sig.append(("o", type(a), a))
        self.actions.append(
            ("library", (call, name, tuple(sig), tuple(where), tuple(host)), consts)
        )

    # -- the result -----------------------------------------------------------

    def finish(
        self, outputs: Sequence[Any], fields: frozenset[str]
    ) -> Recording | None:
        """The :class:`Recording`, or ``None`` (with ``refused`` set) when the
        call cannot be replayed. ``fields`` are the attributes a fresh
        GPUArray has (:func:`gpuarray_fields`)."""
        if self.refused is not None:
            return None
        outs: list[tuple] = []
        for k, o in enumerate(outputs):
            same = next((i for i, v in enumerate(self.inputs) if v is o), None)
            if same is not None:
                outs.append(("same", same))
                continue
            if not (hasattr(o, "gpudata") and hasattr(o, "strides")):
                self.refuse(f"output {k} is a {type(o).__name__}, not a GPU array")
                return None
            template = _array_template(o, fields)
            data = o.gpudata
            if data is None:
                outs.append(("none", type(o), template))
                continue
            p = int(data)
            loc = self.locate(p)
            if loc is None:
                self.refuse(
                    f"output {k} ({p:#x}) is outside the node's inputs and temporaries"
                )
                return None
            slot, off = loc
            owns = slot >= self.n_in and off == 0 and not isinstance(data, int)
            outs.append(("own" if owns else "view", type(o), template, slot, off))
        return Recording(self, outs)


class Recording:
    """What one recorded call did; two equal recordings make a :class:`Tape`."""

    def __init__(self, rec: Recorder, outputs: list[tuple]) -> None:
        self.n_in = rec.n_in
        self.temp_sizes = tuple(n for _, n in rec.temps)
        self.actions = rec.actions
        self.host_copies = rec.host_copies
        self.outputs = outputs
        self.signature = (
            self.temp_sizes,
            tuple((a[0], a[1]) for a in self.actions),
            tuple(
                (o[0], o[1]) if o[0] == "same" else (o[0], o[1], o[2], *o[3:])
                for o in outputs
            ),
        )

    def same_work(self, other: Recording) -> bool:
        try:
            return bool(self.signature == other.signature)
        except Exception:  # a constant whose == is not a bool (arrays)
            return False


_NO_KEY = object()


def _host_part(v: Any) -> Any:
    """A host input's part of a key, or ``_NO_KEY`` when it cannot be one."""
    if v is None or type(v) in (int, float, bool):
        return (type(v), v)
    if isinstance(v, (np.ndarray, np.generic)):
        if v.size > HOST_KEY_MAX_ELEMENTS or v.dtype.kind not in "biuf":
            return _NO_KEY
        return (v.dtype.str, v.shape, v.tobytes())
    return _NO_KEY


def _aliases(ptrs: tuple[int, ...]) -> tuple[int, ...]:
    """Per GPU input, the first input with its address."""
    return tuple(ptrs.index(p) for p in ptrs)


def _key_function(
    gpu_idx: Sequence[int], host_idx: Sequence[int], tf32: Callable[[], bool]
) -> Callable[[Sequence[Any]], tuple | None]:
    """A node's key function (:attr:`NodeTapes.key`), written out for its
    inputs: no loop, and one flat tuple to hash."""
    lines = ["def key(values):", "    if not _mod._enabled:", "        return None"]
    for i in gpu_idx:
        lines += [
            f"    v{i} = values[{i}]",
            f"    d{i} = getattr(v{i}, 'gpudata', None)",
            f"    if d{i} is None:",
            "        return None",
            f"    p{i} = int(d{i})",
        ]
    for i in host_idx:
        lines += [
            f"    h{i} = _host_part(values[{i}])",
            f"    if h{i} is _NO_KEY:",
            "        return None",
        ]
    parts = ["_tf32()"]
    for i in gpu_idx:
        parts += [f"v{i}.shape", f"v{i}.strides", f"p{i} & {_ALIGN_MASK}"]
    parts += [f"h{i}" for i in host_idx]
    lines.append(f"    k = ({', '.join(parts)},)")
    if len(gpu_idx) > 1:
        ptrs = ", ".join(f"p{i}" for i in gpu_idx)
        lines += [
            f"    if len({{{ptrs}}}) != {len(gpu_idx)}:",
            f"        k += (_aliases(({ptrs},)),)",
        ]
    lines.append("    return k")
    namespace = {
        "_mod": sys.modules[__name__],
        "_tf32": tf32,
        "_host_part": _host_part,
        "_NO_KEY": _NO_KEY,
        "_aliases": _aliases,
    }
    exec(compile("\n".join(lines) + "\n", "<cc2ops tape key>", "exec"), namespace)
    return namespace["key"]


def _pointers(kind: str, spec: tuple) -> tuple:
    """The (argument, slot, offset) pointer entries of a recorded action."""
    return spec[3] if kind == "library" else spec[-1]


def gpuarray_fields(sample: Any) -> frozenset[str]:
    """The attributes ``sample`` (a freshly constructed GPUArray) has: what a
    template copies into a replayed output."""
    return frozenset(vars(sample))


class Tape:
    """A replayable recording (see the module docstring).

    Parameters
    ----------
    recording : Recording
    allocator : callable
        ``allocator(nbytes)`` -> an allocation (the device's pool allocator;
        its ``raw`` attribute, when it has one, is used instead: the pool's
        own allocate, without the recording and capture bookkeeping, which a
        replay never needs).
    driver : callable
        ``driver()`` -> the pycuda driver module (copies, memsets).
    pack : callable
        ``pack(fmt, *values)`` -> the kernel argument buffer (pycuda's
        ``_pvt_struct.pack``, what ``prepared_async_call`` uses).

    Attributes
    ----------
    play : callable
        ``play(values, out_cells)`` queues the recorded work for the node's
        input ``values`` and stores the outputs in ``out_cells`` (PyTensor's
        output storage).
    source : str
        The text of ``play``.

    Notes
    -----
    ``play`` is a function generated for this tape (its text is
    :attr:`source`): one statement per input base, temporary, launch, copy,
    library call and output, with the recorded constants bound by name and
    the offsets written in, so that a replay runs no loop and no lookup a
    recording already answered. That is most of what keeps a replayed node's
    host cost near the launches themselves.
    """

    def __init__(
        self,
        recording: Recording,
        allocator: Callable[[int], Any],
        driver: Callable[[], Any],
        pack: Callable[..., bytes],
    ) -> None:
        n_in = recording.n_in
        used = {s for a in recording.actions for (_, s, _) in _pointers(a[0], a[1])}
        used |= {o[3] for o in recording.outputs if o[0] in ("own", "view")}
        # temporaries nothing refers to (a lazily created handle's workspace,
        # say) are not allocated again
        keep = [j for j in range(len(recording.temp_sizes)) if n_in + j in used]
        renumber = {n_in + j: n_in + k for k, j in enumerate(keep)}
        renumber.update({i: i for i in range(n_in)})
        self.n_in = n_in
        self.temp_sizes = tuple(recording.temp_sizes[j] for j in keep)
        self.gpu_inputs = tuple(sorted(s for s in used if s < n_in))
        self.allocator = allocator
        self.host_copies = recording.host_copies
        self.outputs = [self._output(o, renumber) for o in recording.outputs]
        self._plays = [0]
        self.source, self.play = _Generated(self).build(
            recording.actions, renumber, driver, pack
        )

    @property
    def plays(self) -> int:
        """Calls replayed from this tape so far."""
        return self._plays[0]

    @staticmethod
    def _output(o: tuple, renumber: dict[int, int]) -> tuple:
        if o[0] == "same":
            return o
        if o[0] == "none":
            return o
        kind, cls, template, slot, off = o
        return kind, cls, template, renumber[slot], off


class _Generated:
    """Writes a :class:`Tape`'s ``play`` as Python source and compiles it.

    Names in the generated text: ``values`` and ``out_cells`` (the
    arguments), ``b<slot>`` (a slot's base address), ``a<k>`` (temporary
    ``k``'s allocation), ``o`` and ``d`` (an output and its ``__dict__``,
    a copy of the recorded output's with the new buffers); everything
    else (kernels, packers, constants, templates) is a global ``_g<n>`` of
    the generated function.
    """

    def __init__(self, tape: Tape) -> None:
        self.tape = tape
        self.globals: dict[str, Any] = {}
        self.lines: list[str] = []

    def bind(self, obj: Any) -> str:
        """A name for ``obj`` in the generated code (ints written as literals)."""
        if type(obj) is int:
            return repr(obj)
        name = f"_g{len(self.globals)}"
        self.globals[name] = obj
        return name

    @staticmethod
    def address(slot: int, off: int) -> str:
        return f"b{slot}" if off == 0 else f"b{slot} + {off}"

    def owner(self, slot: int) -> str:
        """What keeps slot ``slot``'s buffer alive: the input or the allocation."""
        n_in = self.tape.n_in
        return f"values[{slot}]" if slot < n_in else f"a{slot - n_in}"

    def array(
        self, name: str, cls: type, template: dict, data: str, base: str = "None"
    ) -> str:
        """Emit a GPU array ``name``: ``template``'s attributes with the buffer
        expression ``data`` and the ``base`` expression that keeps it alive
        (``"None"`` for an array that owns its buffer); returns ``name``."""
        emit = self.lines.append
        emit(f"    d = {self.bind({**template, 'gpudata': None, 'base': None})}.copy()")
        emit(f'    d["gpudata"] = {data}')
        if base != "None":
            emit(f'    d["base"] = {base}')
        emit(f"    {name} = {self.bind(cls.__new__)}({self.bind(cls)})")
        emit(f"    {name}.__dict__ = d")
        return name

    def view(self, name: str, cls: type, template: dict, slot: int, off: int) -> str:
        """Emit a GPU array ``name`` over ``slot`` + ``off``, kept alive by the
        slot's owner; returns ``name``."""
        return self.array(
            name, cls, template, self.address(slot, off), self.owner(slot)
        )

    def args(self, consts: Sequence[Any], where: Sequence[tuple]) -> list[str]:
        out = [None if c is None else self.bind(c) for c in consts]
        for i, s, off in where:
            out[i] = self.address(s, off)
        assert all(a is not None for a in out), "a pointer argument without a slot"
        return out  # type: ignore[return-value]

    def build(
        self,
        actions: Sequence[tuple],
        renumber: dict[int, int],
        driver: Callable[[], Any],
        pack: Callable[..., bytes],
    ) -> tuple[str, Callable[..., None]]:
        tape, emit = self.tape, self.lines.append
        n_in = tape.n_in
        emit("def play(values, out_cells):")
        for i in tape.gpu_inputs:
            emit(f"    b{i} = int(values[{i}].gpudata)")
        if tape.temp_sizes:
            alloc = self.bind(getattr(tape.allocator, "raw", tape.allocator))
            for k, n in enumerate(tape.temp_sizes):
                emit(f"    a{k} = {alloc}({n})")
                emit(f"    b{n_in + k} = int(a{k})")
        pack_name = self.bind(pack)
        for kind, spec, consts in actions:
            if kind == "launch":
                fn, grid, block, shared, stream, fmt, _, pointers = spec
                where = [(i, renumber[s], off) for i, s, off in pointers]
                # cuLaunchKernel takes the block itself: pycuda's
                # prepared_async_call also sets the function's legacy block
                # shape (cuFuncSetBlockShape), which only the pre-v4 launch
                # reads, so the replay leaves that call out
                packed = ", ".join([self.bind(fmt), *self.args(consts, where)])
                emit(
                    f"    {self.bind(fn._launch_kernel)}({self.bind(grid)}, "
                    f"{self.bind(block)}, {pack_name}({packed}), "
                    f"{self.bind(shared)}, {self.bind(stream)})"
                )
            elif kind == "driver":
                name, _, pointers = spec
                where = [(i, renumber[s], off) for i, s, off in pointers]
                call = self.bind(getattr(driver(), name))
                emit(f"    {call}({', '.join(self.args(consts, where))})")
            elif kind == "call":
                fn, _, arrays = spec
                where = {i: (renumber[s], off) for i, s, off in arrays}
                args = []
                for i, c in enumerate(consts):
                    if i in where:
                        cls, template = c
                        args.append(self.view(f"c{i}", cls, template, *where[i]))
                    else:
                        args.append(self.bind(c))
                emit(f"    {self.bind(fn)}({', '.join(args)})")
            else:
                call, name, _, pointers, host = spec
                where = [(i, renumber[s], off) for i, s, off in pointers]
                consts = list(consts)
                for i, h in host:
                    # the tape's own copy of the host scalar (alpha, beta)
                    consts[i] = int(tape.host_copies[h].ctypes.data)
                args = ", ".join([self.bind(name), *self.args(consts, where)])
                emit(f"    {self.bind(call)}({args})")
        for k, o in enumerate(tape.outputs):
            if o[0] == "same":
                emit(f"    out_cells[{k}][0] = values[{o[1]}]")
                continue
            if o[0] == "view":
                self.view("o", o[1], o[2], o[3], o[4])
            else:
                # an array that owns its buffer (or has none): the recorded
                # one's attributes with the new allocation, and no base
                data = "None" if o[0] == "none" else f"a{o[3] - n_in}"
                self.array("o", o[1], o[2], data)
            emit(f"    out_cells[{k}][0] = o")
        emit(f"    {self.bind(tape._plays)}[0] += 1")
        source = "\n".join(self.lines) + "\n"
        namespace = dict(self.globals)
        exec(compile(source, "<cc2ops launch tape>", "exec"), namespace)
        return source, namespace["play"]


class NodeTapes:
    """The tapes of one node, keyed by its inputs' geometry (see the module
    docstring), and the policy that makes them.

    Parameters
    ----------
    gpu : sequence of bool
        Per input, whether it is GPU-typed.
    allocator, driver, pack : callable
        As for :class:`Tape`.
    fields : frozenset of str
        What a fresh GPUArray's ``__dict__`` holds (:func:`gpuarray_fields`).
    tf32 : callable
        Returns the TF32 switch (part of every key).

    Attributes
    ----------
    key : callable
        ``key(values)`` -> the replay key of input ``values``, or ``None``
        when no tape applies (tapes switched off, an empty or missing GPU
        input, a large or unhashable host input). A flat tuple: the TF32
        switch; per GPU input its shape, strides and address mod 256; per
        host input its :func:`_host_part`; and, when two GPU inputs share an
        address, which do. Written for the node's inputs
        (:func:`_key_function`).
    tapes : OrderedDict
        Key -> :class:`Tape`, least recently used first.
    """

    def __init__(
        self,
        gpu: Sequence[bool],
        allocator: Callable[[int], Any],
        driver: Callable[[], Any],
        pack: Callable[..., bytes],
        fields: frozenset[str],
        tf32: Callable[[], bool],
    ) -> None:
        self.gpu = tuple(bool(g) for g in gpu)
        self.gpu_idx = tuple(i for i, g in enumerate(self.gpu) if g)
        self.host_idx = tuple(i for i, g in enumerate(self.gpu) if not g)
        self.allocator = allocator
        self.driver = driver
        self.pack = pack
        self.fields = fields
        self.tf32 = tf32
        self.tapes: OrderedDict[tuple, Tape] = OrderedDict()
        self._last: dict[tuple, Recording] = {}
        self._tries: dict[tuple, int] = {}
        #: why the latest recording was not replayable (for diagnostics)
        self.last_refusal: str | None = None
        self.key = _key_function(self.gpu_idx, self.host_idx, tf32)

    def get(self, key: tuple) -> Tape | None:
        """The tape of ``key`` (made the most recently used), if any."""
        tapes = self.tapes
        tape = tapes.get(key)
        if tape is not None and len(tapes) > 1:
            tapes.move_to_end(key)
        return tape

    def wants_recording(self, key: tuple) -> bool:
        """Whether a call with ``key`` should be recorded (not yet given up)."""
        return self._tries.get(key, 0) < MAX_RECORDINGS

    def start(self, values: Sequence[Any]) -> Recorder:
        """Begin recording on this thread (pair with :meth:`stop`)."""
        if _state.rec is not None:
            raise RuntimeError("cc2ops.cuda.tape: a recording is already active")
        rec = Recorder(values, self.gpu, self.fields)
        _state.rec = rec
        return rec

    def stop(self, rec: Recorder, key: tuple, outputs: Sequence[Any] | None) -> None:
        """End recording; ``outputs`` is ``None`` when ``perform`` raised. Two
        consecutive equal recordings of ``key`` become its tape."""
        _state.rec = None
        if outputs is None:
            return
        self._tries[key] = self._tries.get(key, 0) + 1
        recording = rec.finish(outputs, self.fields)
        if recording is None:
            self.last_refusal = rec.refused
            self._last.pop(key, None)
            return
        previous = self._last.get(key)
        if previous is not None and previous.same_work(recording):
            self._last.pop(key, None)
            self.tapes[key] = Tape(recording, self.allocator, self.driver, self.pack)
            self.last_refusal = None
            if len(self.tapes) > MAX_TAPES_PER_NODE:
                self.tapes.popitem(last=False)
            self._tries.pop(key, None)
            return
        if previous is not None:
            self.last_refusal = "two consecutive calls queued different work"
        self._last[key] = recording
        if len(self._tries) > 4 * MAX_TAPES_PER_NODE * MAX_RECORDINGS:
            # many one-off geometries: forget the attempts (and retry later)
            self._tries.clear()
            self._last.clear()
