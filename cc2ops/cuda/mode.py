"""The GPU compilation mode: PyTensor's ``fast_run`` plus the cc2ops GPU rewrites.

``cc2ops.cuda.mode(device=0)`` returns a ``Mode`` whose optimizer is
``fast_run`` including the ``cc2ops`` and ``cc2ops_gpu`` tags (host ops next
to GPU data are lifted to GPU ops, back-to-back transfers cancel) and whose
linker is PyTensor's VM (``cvm``, or the pure-Python ``py`` VM) extended for
GPU values. It is also registered as ``"CC2OPS_GPU"`` (device 0), so
``pytensor.function(..., mode="CC2OPS_GPU")`` works. PyTensor's default
linker (Numba) cannot run custom types, hence the VM.

What the linker adds:

- compiling a function whose graph has GPU-typed variables raises
  :class:`~cc2ops.cuda.CudaUnavailableError` (pycuda, driver or device
  missing, and how to install) when CUDA is unavailable; host-only graphs
  compile anywhere;
- PyTensor's ``DeepCopyOp`` on GPU outputs is replaced by
  :class:`~cc2ops.cuda.transfer.GpuDeepCopy` (``GPUArray.copy()`` cannot copy
  views with gaps);
- host values waiting in GPU-typed storage (shared variables created with
  :func:`cc2ops.cuda.shared`, GPU constants, input defaults) are uploaded
  once, when the function is linked; the shared containers then hold
  GPUArrays, and a function's ``updates`` to them store GPUArrays;
- each call is a scope of deferred checks (:class:`CheckedVM`,
  :mod:`cc2ops.cuda.runtime.checks`): the softmax ops' label checks do not
  hold the host in the middle of a step, and still raise ``ValueError``
  before the caller's state changes.

Calling a compiled function: GPU-typed inputs take GPUArrays (numpy arrays
are copied to the device by the type's ``filter``), GPU-typed outputs come
back as GPUArrays (``cc2ops.cuda.runtime.array.to_host`` or ``.get()`` reads them),
host-typed outputs as numpy arrays.

The GPU op modules (:mod:`cc2ops.cuda.ops`) register their lifting rules
when imported, and importing :mod:`cc2ops.cuda` imports all of them, by name
(see :func:`cc2ops.cuda.ops.load_gpu_op_modules`), so any graph this mode
rewrites sees every rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytensor.compile.mode import Mode, predefined_modes, register_mode
from pytensor.compile.ops import DeepCopyOp
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.link.vm import VMLinker

import cc2ops.rewriting  # noqa: F401  (registers the cc2ops rewrite databases and rules)
from cc2ops.cuda.replay import DEFAULT_MAX_GRAPHS, ReplayVM
from cc2ops.cuda.runtime import checks
from cc2ops.cuda.runtime.array import is_gpuarray, to_gpu
from cc2ops.cuda.runtime.availability import require
from cc2ops.cuda.runtime.device import _check_label
from cc2ops.cuda.transfer import GpuDeepCopy
from cc2ops.cuda.type import CudaArrayType
from cc2ops.distributed import seam
from cc2ops.distributed.hybrid import MultiDeviceMode

__all__ = [
    "GpuMode",
    "CheckedVM",
    "writes_function_input",
    "launch_tapes",
    "GpuVMLinker",
    "MultiGpuMode",
    "multi_gpu_mode",
    "mode",
    "MODE_NAME",
]

MODE_NAME = "CC2OPS_GPU"
LINKERS = ("cvm", "py")


def _needs_cuda(fgraph: Any) -> bool:
    return any(isinstance(v.type, CudaArrayType) for v in fgraph.variables)


def _swap_deep_copies(fgraph: Any, no_recycling: Any) -> Any:
    """Replace ``DeepCopyOp`` on GPU values by ``GpuDeepCopy``; map ``no_recycling``."""
    swapped = {}
    for node in list(fgraph.apply_nodes):
        if isinstance(node.op, DeepCopyOp) and isinstance(
            node.inputs[0].type, CudaArrayType
        ):
            old = node.outputs[0]
            new = GpuDeepCopy()(node.inputs[0])
            fgraph.replace(old, new, reason="cc2ops_gpu_deep_copy")
            swapped[old] = new
    if not swapped or no_recycling is None:
        return no_recycling
    return [swapped.get(v, v) for v in no_recycling]


def _aliased_input(var: Variable) -> Variable | None:
    """The graph input whose memory ``var`` is (through views and in-place
    outputs), or ``None`` when ``var`` is a buffer some node allocated."""
    while var.owner is not None:
        node = var.owner
        k = node.outputs.index(var)
        op = node.op
        src = (getattr(op, "view_map", None) or {}).get(k) or (
            getattr(op, "destroy_map", None) or {}
        ).get(k)
        if not src:
            return None
        var = node.inputs[src[0]]
    return None if isinstance(var, Constant) else var


def writes_function_input(node: Apply) -> bool:
    """Whether ``node`` writes in place into memory a function input owns (a
    shared variable's value, say): an input its ``destroy_map`` names is, or
    is a view of, a graph input."""
    destroy = getattr(node.op, "destroy_map", None) or {}
    return any(
        _aliased_input(node.inputs[i]) is not None
        for outs in destroy.values()
        for i in outs
    )


def _flush_first(thunk: Any) -> Any:
    """``thunk``, run after the pending deferred checks (a node that writes into
    a function input: a bad label raises before the caller's memory changes)."""

    def flushing(thunk: Any = thunk, pending: Any = checks.pending) -> Any:
        if pending():
            checks.flush()
        return thunk()

    for name in ("inputs", "outputs", "lazy", "tapes", "perform"):
        if hasattr(thunk, name):
            setattr(flushing, name, getattr(thunk, name))
    flushing.flushes_checks = True
    return flushing


def _upload_pending(storage_map: dict) -> int:
    """Upload host values found in GPU-typed input storage; returns how many."""
    uploaded = 0
    for var, cell in storage_map.items():
        if var.owner is not None or not isinstance(var.type, CudaArrayType):
            continue
        value = cell[0]
        if value is None or is_gpuarray(value):
            continue
        cell[0] = to_gpu(var.type.filter_host(value), var.type.device)
        uploaded += 1
    return uploaded


class CheckedVM:
    """A PyTensor VM whose calls are scopes of deferred checks.

    A label check made while the wrapped VM runs is read back where it is
    needed (:mod:`cc2ops.cuda.runtime.checks`): before a node writes into an
    input's memory, after a read-back, and here, when the VM returns. The VM
    has updated the function's inputs by then (PyTensor's VMs swap in the new
    values of ``updates`` themselves), so if a check raises, the input cells
    it updated get their old values back: the caller's shared variables are
    as they were before the call, and the error propagates.

    Everything but ``__call__`` is the wrapped VM's, attributes set on it
    included (profilers replace ``thunks``).

    Parameters
    ----------
    vm : callable
        The VM the linker made.
    fgraph : FunctionGraph
        The graph it runs (its ``update_mapping`` names the updated inputs).
    """

    def __init__(self, vm: Any, fgraph: Any) -> None:
        self.vm = vm
        self._check_failed = False
        updates = getattr(fgraph, "update_mapping", None) or {}
        smap = vm.storage_map
        self._updated_cells = [smap[fgraph.inputs[i]] for i in updates.values()]

    _OWN = frozenset({"vm", "_updated_cells", "_check_failed"})

    def __getattr__(self, name: str) -> Any:
        if name == "position_of_error" and self.__dict__.get("_check_failed"):
            # the error is not a node's: PyTensor re-raises it as it is
            raise AttributeError(name)
        return getattr(self.__dict__["vm"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.vm, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cells = self._updated_cells
        before = [c[0] for c in cells]
        self._check_failed = False
        checks.scope_open()
        try:
            out = self.vm(*args, **kwargs)
        except BaseException:
            checks.scope_close(run=False)
            raise
        try:
            checks.scope_close()
        except BaseException:
            for c, v in zip(cells, before, strict=True):
                c[0] = v
            self._check_failed = True
            raise
        return out


class GpuVMLinker(VMLinker):
    """PyTensor's VM linker, plus the CUDA check and the upload of pending host values.

    Parameters
    ----------
    devices : sequence of int
        The device labels the mode is meant for (stored as
        ``cc2ops_devices``; the first is ``cc2ops_device``).
    graphs : bool
        Wrap each function's VM in a :class:`~cc2ops.cuda.replay.ReplayVM`
        (automatic CUDA-graph replay).
    max_graphs : int
        Graphs a ``ReplayVM`` keeps per function.
    **kwargs
        Passed to ``VMLinker`` (``use_cloop=True`` is the ``cvm`` linker).
    """

    def __init__(
        self,
        *args: Any,
        devices: Sequence[int] = (0,),
        graphs: bool = False,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.cc2ops_devices = tuple(devices)
        self.cc2ops_graphs = bool(graphs)
        self.cc2ops_max_graphs = max_graphs

    def accept(self, fgraph: Any, no_recycling: Any = None, profile: Any = None) -> Any:
        no_recycling = _swap_deep_copies(fgraph, no_recycling)
        new = super().accept(fgraph, no_recycling, profile)
        new.cc2ops_devices = self.cc2ops_devices
        new.cc2ops_graphs = self.cc2ops_graphs
        new.cc2ops_max_graphs = self.cc2ops_max_graphs
        return new

    def make_all(
        self,
        profiler: Any = None,
        input_storage: Any = None,
        output_storage: Any = None,
        storage_map: Any = None,
    ) -> Any:
        if _needs_cuda(self.fgraph):
            require()
        result = super().make_all(
            profiler=profiler,
            input_storage=input_storage,
            output_storage=output_storage,
            storage_map=storage_map,
        )
        _upload_pending(result[0].storage_map)
        if _needs_cuda(self.fgraph):
            vm = CheckedVM(result[0], self.fgraph)
            if self.cc2ops_graphs:
                vm = ReplayVM(vm, self.fgraph, self.cc2ops_max_graphs)
            result = (vm, *result[1:])
        return result

    def make_vm(self, nodes: Any, thunks: Any, *args: Any, **kwargs: Any) -> Any:
        # the nodes that write into a function input run the deferred checks
        # first (CheckedVM); the VM is built around the wrapped thunks
        if _needs_cuda(self.fgraph):
            thunks = [
                _flush_first(t) if writes_function_input(n) else t
                for n, t in zip(nodes, thunks, strict=True)
            ]
        return super().make_vm(nodes, thunks, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, devices={self.cc2ops_devices})"


class GpuMode(Mode):
    """The GPU ``Mode``: its linker is a :class:`GpuVMLinker`.

    Its rewrites need no loading step: importing :mod:`cc2ops.cuda` (which
    importing this module implies) imported every GPU op family, and each
    registered its lifting rules then.
    """

    @property
    def cc2ops_devices(self) -> tuple[int, ...]:
        """The device labels this mode was made for (for the multi-GPU rewriter)."""
        return tuple(getattr(self.linker, "cc2ops_devices", (0,)))

    @property
    def cc2ops_device(self) -> int:
        """The main device label of this mode."""
        return self.cc2ops_devices[0]


def launch_tapes(fn: Any) -> list[dict[str, Any]]:
    """What the launch tapes of a compiled GPU function do, node by node.

    One entry per node whose op is taped (``GpuOp.tape_replay``), in the
    order the VM runs them: ``op`` (the node's op), ``tapes`` (input
    geometries with a tape), ``plays`` (calls replayed so far) and
    ``refusal`` (why the latest recording could not be replayed, or
    ``None``). See :mod:`cc2ops.cuda.runtime.tape`.
    """
    vm = getattr(fn, "vm", None)
    vm = getattr(vm, "vm", vm)  # a ReplayVM wraps the linker's VM
    thunks = getattr(vm, "thunks", None)
    if thunks is None:
        raise TypeError(
            f"launch_tapes: {type(fn).__name__} is not a function compiled with "
            "cc2ops.cuda.mode()"
        )
    report = []
    for node, thunk in zip(vm.nodes, thunks, strict=True):
        tapes = getattr(thunk, "tapes", None)
        if tapes is None:
            continue
        report.append(
            {
                "op": str(node.op),
                "tapes": len(tapes.tapes),
                "plays": sum(t.plays for t in tapes.tapes.values()),
                "refusal": tapes.last_refusal,
            }
        )
    return report


def mode(
    device: int = 0,
    devices: Sequence[int] | None = None,
    *,
    linker: str = "cvm",
    comm: str = "auto",
    graphs: bool = False,
    max_graphs: int = DEFAULT_MAX_GRAPHS,
) -> GpuMode:
    """The GPU mode for ``device``.

    Parameters
    ----------
    device : int
        The main device label (``mode.cc2ops_device``).
    devices : sequence of int, optional
        All device labels a multi-GPU graph may use (``mode.cc2ops_devices``,
        ``device`` first); default ``(device,)``.
    linker : {"cvm", "py"}
        PyTensor's C-looped VM (C thunks for PyTensor's own host ops where a
        compiler exists) or the pure-Python VM.
    comm : {"auto", "nccl", "peer", "virtual"}
        With more than one label: how the collectives move data
        (:mod:`cc2ops.cuda.ops.comm`). The mode is then a
        :class:`MultiGpuMode` whose function maker makes the per-device
        replicas and shards of a graph distributed with
        :func:`cc2ops.distributed.hybrid.distribute`.
    graphs : bool
        Automatic CUDA-graph replay (:mod:`cc2ops.cuda.replay`): a function's
        calls replay a captured graph once their input shapes repeat; host
        inputs and outputs are staged through pinned buffers inside the graph.
        Functions that cannot be captured say why once and run eagerly.
    max_graphs : int
        With ``graphs``: captured graphs kept per function (one per input
        signature, least recently used freed first).

    Returns
    -------
    GpuMode

    Notes
    -----
    Building and rewriting graphs with this mode needs no GPU; compiling a
    graph that has GPU-typed variables needs CUDA.
    """
    device = _check_label(device)
    if devices is None:
        labels: tuple[int, ...] = (device,)
    else:
        labels = tuple(_check_label(d) for d in devices)
        if not labels:
            raise ValueError("cc2ops.cuda.mode: devices must not be empty")
        if len(set(labels)) != len(labels):
            raise ValueError(f"cc2ops.cuda.mode: devices has repeated labels: {labels}")
        if device not in labels:
            raise ValueError(
                f"cc2ops.cuda.mode: device {device} is not one of devices {labels}"
            )
        labels = (device, *(d for d in labels if d != device))
    if isinstance(graphs, bool) is False:
        raise TypeError(
            f"cc2ops.cuda.mode: graphs must be True or False, got {graphs!r}"
        )
    if isinstance(max_graphs, bool) or not isinstance(max_graphs, int):
        raise TypeError(
            f"cc2ops.cuda.mode: max_graphs must be an int, got {max_graphs!r}"
        )
    if max_graphs < 1:
        raise ValueError(f"cc2ops.cuda.mode: max_graphs must be >= 1, got {max_graphs}")
    if graphs and len(labels) > 1:
        raise ValueError(
            f"cc2ops.cuda.mode: graphs=True replays one device's stream; got "
            f"devices {labels}"
        )
    extra = {"devices": labels, "graphs": graphs, "max_graphs": max_graphs}
    if linker == "cvm":
        lk = GpuVMLinker(use_cloop=True, **extra)
    elif linker == "py":
        lk = GpuVMLinker(use_cloop=False, c_thunks=False, **extra)
    else:
        raise ValueError(
            f"cc2ops.cuda.mode: linker must be one of {LINKERS}, got {linker!r}"
        )
    if len(labels) > 1:
        # several labels: the multi-device function maker (cc2ops.distributed)
        return multi_gpu_mode(lk, labels, comm)
    return GpuMode(linker=lk, optimizer="fast_run").including("cc2ops", "cc2ops_gpu")


class MultiGpuMode(MultiDeviceMode, GpuMode):
    """The GPU mode (lifting, GPU linker) plus the multi-device function maker."""


def multi_gpu_mode(linker: Any, labels: Sequence[int], impl: str = "auto") -> Any:
    """A GPU mode over ``labels`` whose function maker localises the state.

    ``cc2ops.cuda.mode(devices=[...])`` calls this for more than one label. The
    collectives come from the backend :mod:`cc2ops.cuda.ops.comm` registered
    with :mod:`cc2ops.distributed.seam` (the op families sit above the modes).
    """
    m = MultiGpuMode(linker=linker, optimizer="fast_run").including(
        "cc2ops", "cc2ops_gpu"
    )
    m.backend = seam.device_backend().comm_backend(labels, impl)
    return m


if MODE_NAME not in predefined_modes:
    register_mode(MODE_NAME, mode(0))


def __getattr__(name: str) -> Any:
    # load_gpu_op_modules moved to cc2ops.cuda.ops (the op modules are above
    # the mode); the old name works until the next release
    if name == "load_gpu_op_modules":
        import importlib
        import warnings

        warnings.warn(
            "cc2ops.cuda.mode.load_gpu_op_modules moved to "
            "cc2ops.cuda.ops.load_gpu_op_modules; the old name works until the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("cc2ops.cuda.ops").load_gpu_op_modules
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
