"""Moving host graphs onto the GPU, and cancelling back-to-back transfers.

Lifting
-------
GPU op authors register a rule per host op class in their
``cc2ops/cuda/ops/<family>.py`` module::

    from cc2ops.cuda.rewriting.lift import register_lift, to_gpu

    @register_lift(FilterActs)
    def lift_filter_acts(fgraph, node, device):
        images, filters = (to_gpu(v, device) for v in node.inputs)
        return [GpuFilterActs(**node.op._props_dict())(images, filters)]

A rule returns one GPU-typed variable per output of ``node`` (or ``None`` to
decline). The single node rewriter :data:`local_lift_to_gpu` (database
``gpu_lift_db``, tag ``cc2ops_gpu``) tracks every registered class: a node is
lifted when one of its inputs is ``host_from_gpu(v)`` (then to ``v``'s
device) or, failing that, when one of its outputs feeds a
``gpu_from_host[d]`` (then to ``d``); a node with no GPU neighbour stays on
the host. Each new output is wrapped as ``host_from_gpu(out)``, so host
consumers still type-check; the transfer-cancelling rules then remove the
``gpu_from_host(host_from_gpu(...))`` pairs between lifted nodes, so lifting
spreads along the graph until it reaches inputs, outputs or ops without a GPU
rule. Nodes that a rule builds around its GPU op (a host fallback, say) are
marked and never lifted again, which keeps the equilibrium finite.

Transfer cancelling
-------------------
Small named rules (database ``transfer_cancel_db``, tags ``fast_run`` and
``cc2ops_gpu``; see :mod:`cc2ops.rewriting.db` for why ``fast_run``)::

    host_from_gpu(gpu_from_host[d](x))           -> x
    gpu_from_host[d](host_from_gpu(x on d))      -> x
    gpu_from_host[d2](host_from_gpu(x on d1))    -> gpu_to_gpu(x, d2)
    gpu_to_gpu(x on d, d)                        -> x
    gpu_to_gpu(gpu_to_gpu(x, d1), d2)            -> gpu_to_gpu(x, d2)
    host_from_gpu(gpu_to_gpu(x, d))              -> host_from_gpu(x)
    gpu_to_gpu(gpu_from_host[d1](x), d2)         -> gpu_from_host[d2](x)

A replacement is only made when its type is the replaced variable's type or
a more specific one (static shapes), so rewriting never loses shape
information or fails the graph's type checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pytensor.graph.basic import Apply, Variable
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import NodeRewriter, copy_stack_trace, node_rewriter

from cc2ops.cuda.transfer import (
    GpuFromHost,
    GpuToGpu,
    HostFromGpu,
    as_gpu,
    gpu_to_gpu,
    host_from_gpu,
)
from cc2ops.cuda.type import CudaArrayType
from cc2ops.rewriting.db import gpu_lift_db, transfer_cancel_db

__all__ = [
    "register_lift",
    "lift_rules",
    "to_gpu",
    "lift_device",
    "local_lift_to_gpu",
    "local_cancel_host_gpu_host",
    "local_cancel_gpu_host_gpu",
    "local_gpu_host_gpu_to_gpu_to_gpu",
    "local_cancel_gpu_to_same_gpu",
    "local_merge_gpu_to_gpu",
    "local_host_from_gpu_to_gpu",
    "local_gpu_to_gpu_from_host",
]

LiftRule = Callable[[Any, Apply, int], "Sequence[Variable] | None"]

_RULES: dict[type, LiftRule] = {}
_NO_LIFT_TAG = "cc2ops_no_lift"


def register_lift(*host_op_classes: type) -> Callable[[LiftRule], LiftRule]:
    """Decorator registering ``rule(fgraph, node, device)`` for host op classes.

    The rule returns one GPU-typed variable per output of ``node``, or
    ``None`` to leave the node on the host. Subclasses of a registered class
    use its rule unless they have their own.
    """
    if not host_op_classes:
        raise TypeError("register_lift: give at least one host Op class")
    for cls in host_op_classes:
        if not (isinstance(cls, type) and issubclass(cls, Op)):
            raise TypeError(f"register_lift: {cls!r} is not an Op class")

    def decorate(rule: LiftRule) -> LiftRule:
        for cls in host_op_classes:
            _RULES[cls] = rule
        return rule

    return decorate


def lift_rules() -> dict[type, LiftRule]:
    """The registered ``{host op class: rule}`` (a copy)."""
    return dict(_RULES)


def _rule_for(op: Op) -> LiftRule | None:
    for cls in type(op).__mro__:
        rule = _RULES.get(cls)
        if rule is not None:
            return rule
    return None


def to_gpu(var: Variable, device: int) -> Variable:
    """``var`` on GPU ``device`` for a lifting rule, with the fewest transfers.

    ``host_from_gpu(v)`` gives ``v`` (moved with ``gpu_to_gpu`` if ``v`` is on
    another device); other host variables get ``gpu_from_host``.
    """
    return as_gpu(var, device)


def lift_device(fgraph: Any, node: Apply) -> int | None:
    """The device ``node`` would be lifted to, or ``None`` (no GPU neighbour)."""
    for inp in node.inputs:
        owner = inp.owner
        if owner is not None and isinstance(owner.op, HostFromGpu):
            return owner.inputs[0].type.device
    clients = getattr(fgraph, "clients", {})
    for out in node.outputs:
        for client, _ in clients.get(out, ()):
            op = getattr(client, "op", None)
            if isinstance(op, GpuFromHost):
                return op.device
    return None


def _mark_new_nodes(fgraph: Any, node: Apply, outputs: Sequence[Variable]) -> None:
    """Tag nodes of registered classes that a rule created, so they stay put."""
    known = set(node.inputs)
    in_graph = getattr(fgraph, "variables", set())
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        if id(v) in seen or v in known or v in in_graph or v.owner is None:
            continue
        seen.add(id(v))
        if _rule_for(v.owner.op) is not None:
            setattr(v.owner.tag, _NO_LIFT_TAG, True)
        stack.extend(v.owner.inputs)


def _compatible(old: Variable, new: Variable) -> Variable | None:
    """``new`` if its type may replace ``old``'s (converted when needed), else None."""
    if old.type == new.type or old.type.is_super(new.type):
        return new
    try:
        return old.type.filter_variable(new, allow_convert=True)
    except TypeError:
        return None


def _host_shape_arithmetic(node: Apply) -> bool:
    """Integer scalars or vectors computed from host values only: shapes,
    sizes, indices. They stay on the host, where their consumers (a reshape's
    shape, an alloc's sizes) read them; lifted, each would be read back, a
    device synchronisation per call. A GPU consumer gets one upload."""
    for out in node.outputs:
        dtype = str(getattr(out.type, "dtype", ""))
        if not dtype.startswith(("int", "uint")) or getattr(out.type, "ndim", 2) > 1:
            return False
    return not any(
        inp.owner is not None and isinstance(inp.owner.op, HostFromGpu)
        for inp in node.inputs
    )


class _LiftToGpu(NodeRewriter):
    """Lift a host node next to GPU data with its registered rule (module doc)."""

    def tracks(self) -> list[type] | None:
        return list(_RULES) or None

    def transform(
        self,
        fgraph: Any,
        node: Apply,
        enforce_tracks: bool = True,
        *args: Any,
        **kwargs: Any,
    ) -> list[Variable] | None:
        rule = _rule_for(node.op)
        if rule is None or getattr(node.tag, _NO_LIFT_TAG, False):
            return None
        if _host_shape_arithmetic(node):
            return None
        device = lift_device(fgraph, node)
        if device is None:
            return None
        outs = rule(fgraph, node, device)
        if outs is None:
            return None
        outs = list(outs)
        name = getattr(rule, "__name__", repr(rule))
        if len(outs) != len(node.outputs):
            raise ValueError(
                f"lift rule {name} for {node.op} returned {len(outs)} outputs, the "
                f"node has {len(node.outputs)}"
            )
        replacements = []
        for old, new in zip(node.outputs, outs, strict=True):
            if not isinstance(getattr(new, "type", None), CudaArrayType):
                raise TypeError(
                    f"lift rule {name} for {node.op} must return GPU variables, got "
                    f"{getattr(new, 'type', type(new).__name__)}"
                )
            if new.type.dtype != old.type.dtype or new.type.ndim != old.type.ndim:
                raise TypeError(
                    f"lift rule {name} for {node.op} returned {new.type} for an output "
                    f"of type {old.type}"
                )
            copy_stack_trace(old, new)
            host = host_from_gpu(new)
            copy_stack_trace(old, host)
            fitted = _compatible(old, host)
            if fitted is None:
                return None
            replacements.append(fitted)
        _mark_new_nodes(fgraph, node, outs)
        return replacements

    def __str__(self) -> str:
        return "local_lift_to_gpu"


#: The one rewriter that applies every :func:`register_lift` rule.
local_lift_to_gpu = _LiftToGpu()


def _replace(old: Variable, new: Variable) -> list[Variable] | None:
    fitted = _compatible(old, new)
    if fitted is None:
        return None
    copy_stack_trace(old, fitted)
    return [fitted]


@node_rewriter([HostFromGpu])
def local_cancel_host_gpu_host(fgraph, node):
    """``host_from_gpu(gpu_from_host[d](x)) -> x``."""
    (v,) = node.inputs
    if v.owner is not None and isinstance(v.owner.op, GpuFromHost):
        return _replace(node.outputs[0], v.owner.inputs[0])
    return None


@node_rewriter([GpuFromHost])
def local_cancel_gpu_host_gpu(fgraph, node):
    """``gpu_from_host[d](host_from_gpu(x on d)) -> x``."""
    (h,) = node.inputs
    if h.owner is not None and isinstance(h.owner.op, HostFromGpu):
        x = h.owner.inputs[0]
        if x.type.device == node.op.device:
            return _replace(node.outputs[0], x)
    return None


@node_rewriter([GpuFromHost])
def local_gpu_host_gpu_to_gpu_to_gpu(fgraph, node):
    """``gpu_from_host[d2](host_from_gpu(x on d1)) -> gpu_to_gpu(x, d2)``, d1 != d2."""
    (h,) = node.inputs
    if h.owner is not None and isinstance(h.owner.op, HostFromGpu):
        x = h.owner.inputs[0]
        if x.type.device != node.op.device:
            return _replace(node.outputs[0], gpu_to_gpu(x, node.op.device))
    return None


@node_rewriter([GpuToGpu])
def local_cancel_gpu_to_same_gpu(fgraph, node):
    """``gpu_to_gpu(x on d, d) -> x``."""
    if node.op.src == node.op.dst:
        return _replace(node.outputs[0], node.inputs[0])
    return None


@node_rewriter([GpuToGpu])
def local_merge_gpu_to_gpu(fgraph, node):
    """``gpu_to_gpu(gpu_to_gpu(x, d1), d2) -> gpu_to_gpu(x, d2)`` (``x`` if on d2)."""
    (v,) = node.inputs
    if v.owner is not None and isinstance(v.owner.op, GpuToGpu):
        x = v.owner.inputs[0]
        dst = node.op.dst
        return _replace(
            node.outputs[0], x if x.type.device == dst else gpu_to_gpu(x, dst)
        )
    return None


@node_rewriter([HostFromGpu])
def local_host_from_gpu_to_gpu(fgraph, node):
    """``host_from_gpu(gpu_to_gpu(x, d)) -> host_from_gpu(x)`` (read the source)."""
    (v,) = node.inputs
    if v.owner is not None and isinstance(v.owner.op, GpuToGpu):
        return _replace(node.outputs[0], host_from_gpu(v.owner.inputs[0]))
    return None


@node_rewriter([GpuToGpu])
def local_gpu_to_gpu_from_host(fgraph, node):
    """``gpu_to_gpu(gpu_from_host[d1](x), d2) -> gpu_from_host[d2](x)``."""
    (v,) = node.inputs
    if v.owner is not None and isinstance(v.owner.op, GpuFromHost):
        return _replace(node.outputs[0], GpuFromHost(node.op.dst)(v.owner.inputs[0]))
    return None


_CANCEL_RULES = (
    local_cancel_host_gpu_host,
    local_cancel_gpu_host_gpu,
    local_gpu_host_gpu_to_gpu_to_gpu,
    local_cancel_gpu_to_same_gpu,
    local_merge_gpu_to_gpu,
    local_host_from_gpu_to_gpu,
    local_gpu_to_gpu_from_host,
)

for _rule in _CANCEL_RULES:
    transfer_cancel_db.register(_rule.__name__, _rule, "fast_run", "cc2ops_gpu")
    # Inside the lifting equilibrium, host_from_gpu(gpu_from_host(x)) -> x would
    # win the race against lifting the consumer of that round trip (the transfer
    # nodes come first in the graph) and leave the consumer with no GPU
    # neighbour: an explicit upload is a request to compute on the GPU. The
    # standalone cancel pass after lifting removes what is left of such pairs.
    if _rule is not local_cancel_host_gpu_host:
        gpu_lift_db.register(f"lift_{_rule.__name__}", _rule, "cc2ops_gpu")

gpu_lift_db.register("local_lift_to_gpu", local_lift_to_gpu, "cc2ops_gpu")
