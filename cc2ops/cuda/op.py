"""The base class of every cc2ops GPU op.

A GPU op is a :class:`~cc2ops._op.Cc2Op` whose inputs and outputs are
:class:`~cc2ops.cuda.type.CudaArrayType` variables (plus host scalars or
integer shapes where needed). Building and rewriting graphs with it never
touches CUDA; CUDA is first touched when a compiled function is linked
(:meth:`GpuOp.prepare_node` initialises the devices), and ``perform`` runs
with the op's device current. GPU ops are never constant-folded: folding
would run them while a graph is rewritten.

The pattern for a GPU op (``cc2ops/cuda/ops/<family>.py``)::

    from pytensor.graph.basic import Apply

    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.compile import get_kernel, launch, register_variants
    from cc2ops.cuda.op import GpuOp, as_gpu_variable
    from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
    from cc2ops.cuda.transfer import as_gpu_cotangent

    class GpuScale(GpuOp):
        __props__ = ("factor",)

        def __init__(self, *, factor):
            self.factor = float(factor)

        def make_node(self, x):
            x = as_gpu_variable(x, op="GpuScale", role="x")
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, outputs):
            (x,) = inputs
            device = self.device_of(node)
            out = array.empty(x.shape, x.dtype, device)
            fn = get_kernel("scale", device, name="scale_f32", dtype="float32")
            launch(fn, grid, block, [array.ascontiguous(x, device), out, ...], device)
            outputs[0][0] = out

        def _infer_shape(self, node, input_shapes):
            return [input_shapes[0]]

        def pullback(self, inputs, outputs, cotangents):
            (g,) = cotangents
            g = as_gpu_cotangent(g, self.device_of_var(inputs[0]))
            return [GpuScale(factor=self.factor)(g)]

    @register_lift(Scale)
    def lift_scale(fgraph, node, device):
        return [GpuScale(factor=node.op.factor)(to_gpu(node.inputs[0], device))]

Kernel templates live in ``cc2ops/cuda/kernels/<family>.cu``; register their
representative constants with ``@register_variants("<family>")`` so the CPU
test suite compiles them. Outputs are allocated with
:func:`cc2ops.cuda.runtime.array.empty` (the device pool);
inputs may be non-contiguous views (``array.ascontiguous`` when a kernel needs
C order). Cotangents may arrive host-typed (PyTensor adds gradient terms with
host ops), so pullbacks pass them through
:func:`cc2ops.cuda.transfer.as_gpu_cotangent`.

The GPU twin of a cc2ops host op writes none of this gradient code: it
inherits the host op's skeleton from the frontend module
(``cc2ops.pool.MaxPoolSkeleton``, ...: shape rule, connection pattern,
pullback, pushforward) and :class:`cc2ops.cuda.transfer.GpuGradients` (the
skeletons' hooks for GPU tensors), names its backend's ops in ``family``,
and adds only its props, ``make_node`` and ``perform`` (see
:mod:`cc2ops._op`)::

    class _GpuPool(GpuGradients, GpuOp):
        __props__ = ("size", "stride", "start")

    class GpuMaxPool(MaxPoolSkeleton, _GpuPool):
        def make_node(self, x): ...
        def perform(self, node, inputs, output_storage): ...

    _GpuPool.family = PoolFamily(GpuMaxPool, GpuMaxPoolGrad, ...)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pytensor.graph.basic import Apply, Variable

from cc2ops._op import FLOAT_DTYPES, Cc2Op
from cc2ops.cuda.runtime.availability import driver, require
from cc2ops.cuda.runtime.cudagraph import any_capture as cudagraph_active
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.runtime.precision import get_allow_tf32
from cc2ops.cuda.runtime.tape import NodeTapes, gpuarray_fields
from cc2ops.cuda.type import CudaArrayType

__all__ = [
    "GpuOp",
    "common_device",
    "as_gpu_variable",
    "gpu_float_variable",
    "devices_of",
]


_TAPE_PARTS: dict[int, tuple | None] = {}


def _tape_parts(dev: Any) -> tuple | None:
    """pycuda's argument packer and the attributes of a fresh GPUArray, checked
    once per physical device; ``None`` (no tapes) if they are not as expected."""
    if dev.index in _TAPE_PARTS:
        return _TAPE_PARTS[dev.index]
    parts = None
    try:
        from pycuda._pvt_struct import pack
        from pycuda.gpuarray import GPUArray

        sample = GPUArray((1,), np.float32, allocator=dev.allocator)
        fields = gpuarray_fields(sample)
        if {"gpudata", "base", "shape", "strides", "dtype"} <= fields:
            parts = (pack, fields)
    except Exception:  # pycuda without these internals: perform only
        parts = None
    _TAPE_PARTS[dev.index] = parts
    return parts


def devices_of(variables: Any) -> list[int]:
    """The distinct device labels of the GPU-typed ``variables``, in order."""
    seen: list[int] = []
    for v in variables:
        t = getattr(v, "type", None)
        if isinstance(t, CudaArrayType) and t.device not in seen:
            seen.append(t.device)
    return seen


def common_device(op_name: str, *variables: Any) -> int:
    """The one device label of the GPU-typed ``variables``, else ``ValueError``.

    For ``make_node``: ``common_device("GpuFilterActs", images, filters)``
    raises ``"GpuFilterActs: inputs live on devices 0 and 1"``.
    """
    labels = devices_of(variables)
    if not labels:
        raise ValueError(f"{op_name}: no input lives on a GPU")
    if len(labels) > 1:
        listed = ", ".join(str(d) for d in labels[:-1]) + f" and {labels[-1]}"
        raise ValueError(f"{op_name}: inputs live on devices {listed}")
    return labels[0]


def as_gpu_variable(
    x: Any, device: int | None = None, *, op: str = "GpuOp", role: str = "input"
) -> Variable:
    """``x`` if it is a GPU variable (on ``device`` when given), else an error.

    For ``make_node``: ``as_gpu_variable(images, op="GpuFilterActs",
    role="images")``. GPU ops do not move host data implicitly: a host input
    (``TypeError``) means the graph should have been lifted
    (``cc2ops.cuda.mode()`` does that) or the caller should wrap it in
    ``gpu_from_host``; a GPU input on another device is a ``ValueError``.
    """
    if not isinstance(x, Variable):
        raise TypeError(
            f"{op}: {role} must be a GPU variable (CudaArrayType), got "
            f"{type(x).__name__}; wrap host data in cc2ops.cuda.gpu_from_host"
        )
    if not isinstance(x.type, CudaArrayType):
        raise TypeError(
            f"{op}: {role} must be a GPU variable (CudaArrayType), got {x.type}; "
            "compile with cc2ops.cuda.mode() to lift host graphs to the GPU, or wrap "
            "it in cc2ops.cuda.gpu_from_host"
        )
    if device is not None and x.type.device != device:
        raise ValueError(
            f"{op}: {role} lives on device {x.type.device}, expected device {device}"
        )
    return x


def gpu_float_variable(op: str, role: str, x: Any, ndim: int, axes: str) -> Variable:
    """``x`` as a float32/float64 GPU variable of ``ndim`` dims, else ``TypeError``.

    The GPU twin of :func:`cc2ops._op.float_tensor` for ``make_node``
    (:func:`as_gpu_variable` first): ``axes`` is the expected axis order for
    the message, e.g. ``"(B, C, H, W)"``.
    """
    x = as_gpu_variable(x, op=op, role=role)
    if x.type.ndim != ndim:
        dims = f"{ndim} dim" if ndim == 1 else f"{ndim} dims"
        raise TypeError(f"{op}: {role} must have {dims} {axes}, got {x.type.ndim}")
    if x.type.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {x.type.dtype}")
    return x


class GpuOp(Cc2Op):
    """Base class of the cc2ops GPU ops (see the module docstring for the pattern).

    Subclasses implement ``make_node``, ``perform``, ``_infer_shape`` and
    ``pullback`` as for any :class:`~cc2ops._op.Cc2Op`. This base class
    initialises CUDA when a function using the op is linked, activates the
    op's device around ``perform`` and forbids constant folding.
    """

    #: Whether the node's calls may be replayed from a launch tape
    #: (:mod:`cc2ops.cuda.runtime.tape`). An op that sets it promises that its
    #: ``perform`` queues device work only through the runtime's entry points
    #: (``launch``, ``array``'s allocation, copy and fill helpers, cuBLAS) and
    #: that nothing it does depends on host state outside its inputs'
    #: geometry, its small host inputs and the TF32 switch.
    tape_replay: bool = False

    def do_constant_folding(self, fgraph: Any, node: Apply) -> bool:
        return False

    def _node_tapes(self, node: Apply, dev: Any) -> NodeTapes | None:
        """The tape cache of ``node`` (``None`` when pycuda's array type or
        argument packer is not what the tapes expect)."""
        parts = _tape_parts(dev)
        if parts is None:
            return None
        pack, fields = parts
        gpu = [isinstance(v.type, CudaArrayType) for v in node.inputs]
        return NodeTapes(gpu, dev.allocator, driver, pack, fields, get_allow_tf32)

    def device_of(self, node: Apply) -> int:
        """The one device label of ``node``'s GPU inputs and outputs."""
        labels = devices_of(list(node.inputs) + list(node.outputs))
        if not labels:
            raise ValueError(
                f"{type(self).__name__}: the node has no GPU input or output"
            )
        if len(labels) > 1:
            listed = ", ".join(str(d) for d in labels[:-1]) + f" and {labels[-1]}"
            raise ValueError(f"{type(self).__name__}: the node spans devices {listed}")
        return labels[0]

    @staticmethod
    def device_of_var(var: Variable) -> int:
        """The device label of a GPU variable."""
        if not isinstance(var.type, CudaArrayType):
            raise TypeError(f"expected a GPU variable, got {var.type}")
        return var.type.device

    def thunk_device(self, node: Apply) -> int:
        """The device made current around ``perform`` (default :meth:`device_of`)."""
        return self.device_of(node)

    def prepare_node(
        self, node: Apply, storage_map: Any, compute_map: Any, impl: Any
    ) -> None:
        # linking is where CUDA is first touched: fail here with the clear message
        require()
        for label in devices_of(list(node.inputs) + list(node.outputs)):
            get_device(label)

    def make_thunk(
        self,
        node: Apply,
        storage_map: Any,
        compute_map: Any,
        no_recycling: Any,
        impl: str | None = None,
    ) -> Any:
        thunk = super().make_thunk(
            node, storage_map, compute_map, no_recycling, impl=impl
        )
        dev = get_device(self.thunk_device(node))
        tapes = self._node_tapes(node, dev) if self.tape_replay else None

        if tapes is None:

            def gpu_thunk(thunk: Any = thunk, dev: Any = dev) -> Any:
                dev.activate()
                return thunk()

        else:
            in_cells = [storage_map[v] for v in node.inputs]
            out_cells = [storage_map[v] for v in node.outputs]
            computed = [compute_map[v] for v in node.outputs] if compute_map else []

            def gpu_thunk(
                thunk: Any = thunk,
                dev: Any = dev,
                tapes: NodeTapes = tapes,
                key_of: Any = tapes.key,
                tape_of: Any = tapes.get,
                in_cells: list = in_cells,
                out_cells: list = out_cells,
                computed: list = computed,
            ) -> Any:
                dev.activate()
                if cudagraph_active():
                    return thunk()  # a capture records perform's own launches
                values = [c[0] for c in in_cells]
                key = key_of(values)
                if key is None:
                    return thunk()
                tape = tape_of(key)
                if tape is not None:
                    tape.play(values, out_cells)
                    for c in computed:
                        c[0] = True
                    return None
                if not tapes.wants_recording(key):
                    return thunk()
                rec = tapes.start(values)
                done = False
                try:
                    out = thunk()
                    done = True
                finally:
                    tapes.stop(rec, key, [c[0] for c in out_cells] if done else None)
                return out

        gpu_thunk.tapes = tapes  # read by launch_tapes (cc2ops.cuda.mode)
        gpu_thunk.inputs = thunk.inputs
        gpu_thunk.outputs = thunk.outputs
        gpu_thunk.lazy = getattr(thunk, "lazy", False)
        if hasattr(thunk, "perform"):
            gpu_thunk.perform = thunk.perform
        return gpu_thunk


def __getattr__(name: str) -> Any:
    # as_gpu_cotangent moved to cc2ops.cuda.transfer (it builds transfer ops,
    # which are GpuOps: defining it here made op and transfer import each
    # other); the old name works until the next release
    if name == "as_gpu_cotangent":
        import importlib
        import warnings

        warnings.warn(
            "cc2ops.cuda.op.as_gpu_cotangent moved to "
            "cc2ops.cuda.transfer.as_gpu_cotangent; the old name works until the "
            "next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("cc2ops.cuda.transfer").as_gpu_cotangent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
