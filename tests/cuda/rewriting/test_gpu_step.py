"""The whole ImageNet training step rewrites to GPU ops (CPU only: no CUDA touched).

The training step of :mod:`cc2ops.testing.nets` (the example's trained step)
on the cuda-convnet2 ImageNet net (batch 128, 224x224, dropout on, momentum
SGD with weight decay; parameters, velocities and dropout states on the GPU)
and on the two CIFAR-10 nets (11pct; 18pct, whose average pooling the
others lack) is put through the GPU mode's rewrites exactly as
``pytensor.function`` would (``FunctionMaker``, without linking). Every
Apply node that computes on arrays must then be a GPU op:

- the only host->GPU transfers are of the minibatch inputs (images, labels);
- the only GPU->host transfers are of the requested scalar outputs;
- no host op touches a float array; what may stay on the host is integer
  bookkeeping of at most one dim that never reads a GPU value (shape
  arithmetic); the dropout states live on the GPU, so the step has no host
  ``DropoutAdvance`` at all;
- every update of a GPU parameter or velocity is a GPU value.

On failure the offending nodes are printed with their input types. This is
the integration check of every GPU op family's lifting rules.
"""

from __future__ import annotations

import pytest
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.tensor.shape import Shape, Shape_i

import cc2ops.cuda as cuda
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu
from cc2ops.cuda.type import CudaArrayType, CudaSharedVariable
from cc2ops.testing.nets import StepConfig, build_step

IMAGENET = StepConfig("imagenet", batch=128)
#: The ImageNet net, small enough to build in a moment, with its dropout.
TINY_IMAGENET = StepConfig("imagenet", batch=16, crop=67, classes=10, width_mult=1 / 16)


def rewritten_step(cfg, **kwargs):
    """(fgraph, step) of the step rewritten by the GPU mode, not linked."""
    step = build_step(cfg, gpu_params=True, **kwargs)
    mode = cuda.mode()
    inputs, outputs = construct_function_ins_and_outs(
        step.inputs, step.outputs, updates=step.updates
    )
    maker = mode.function_maker(inputs, outputs, mode, on_unused_input="ignore")
    return maker.fgraph, step


def describe(node):
    ins = ", ".join(f"{v.type}" for v in node.inputs)
    return f"{node.op} ({type(node.op).__name__}) <- [{ins}]"


def _is_small_int(v):
    t = v.type
    return (
        not isinstance(t, CudaArrayType)
        and getattr(t, "dtype", "int64").startswith(("int", "uint"))
        and getattr(t, "ndim", 0) <= 1
    )


def host_array_nodes(fgraph):
    """Host nodes computing on arrays (anything beyond small-int bookkeeping)."""
    bad = []
    for node in fgraph.toposort():
        if isinstance(node.op, GpuOp):
            continue
        reads_gpu = any(
            v.owner is not None and isinstance(v.owner.op, HostFromGpu)
            for v in node.inputs
        )
        bookkeeping = all(_is_small_int(v) for v in node.inputs + node.outputs)
        # the shape of a host input is metadata, not array work
        shape_of_input = isinstance(node.op, (Shape, Shape_i)) and all(
            v.owner is None for v in node.inputs
        )
        if reads_gpu or not (bookkeeping or shape_of_input):
            bad.append(node)
    return bad


def check_gpu_step(fgraph, step, shape_scalars=False):
    """Problems of the rewritten step; ``shape_scalars`` allows 0-d int uploads.

    With a dynamic batch size, ``B`` (an int64 read from the images' shape)
    feeds GPU arithmetic such as the mean's ``1/B``; its per-call upload is
    then allowed.
    """
    problems = []
    minibatch = set(step.inputs)
    for node in fgraph.apply_nodes:
        if isinstance(node.op, GpuFromHost):
            src = node.inputs[0]
            scalar = src.type.ndim == 0 and _is_small_int(src)
            if src not in minibatch and not (shape_scalars and scalar):
                problems.append(f"transfer of a non-input to the GPU: {describe(node)}")
        if isinstance(node.op, HostFromGpu):
            out = node.outputs[0]
            is_output = out in fgraph.outputs
            if not is_output or out.type.ndim != 0:
                problems.append(f"GPU value pulled to the host: {describe(node)}")
    problems += [f"host array op: {describe(n)}" for n in host_array_nodes(fgraph)]
    problems += [
        f"host dropout counter advance (the state should live on the GPU): "
        f"{describe(n)}"
        for n in fgraph.apply_nodes
        if type(n.op).__name__ == "DropoutAdvance"
    ]
    problems += [
        f"dropout state {s} is not a GPU variable"
        for s in step.dropout_states
        if not isinstance(s.type, CudaArrayType)
    ]
    for out_idx, in_idx in fgraph.update_mapping.items():
        var = fgraph.inputs[in_idx]
        new = fgraph.outputs[out_idx]
        if isinstance(var.type, CudaArrayType) and not isinstance(
            new.type, CudaArrayType
        ):
            problems.append(f"update of {var} computed on the host: {new}")
    transfers_in = sorted(
        str(n.inputs[0]) for n in fgraph.apply_nodes if isinstance(n.op, GpuFromHost)
    )
    return problems, transfers_in


def test_creating_gpu_parameters_does_not_touch_cuda(monkeypatch):
    import cc2ops.cuda.runtime.array as garray

    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA was touched while building the step")

    for name in ("to_gpu", "empty", "copy"):
        monkeypatch.setattr(garray, name, forbidden)
    step = build_step(TINY_IMAGENET, gpu_params=True)
    params = list(step.params.values()) + list(step.velocities.values())
    assert all(isinstance(p, CudaSharedVariable) for p in params)
    assert not any(p.is_uploaded for p in params)
    assert len(step.dropout_states) == 2
    for state in step.dropout_states:
        assert isinstance(state, CudaSharedVariable) and not state.is_uploaded


def test_dropout_step_advances_its_gpu_states_on_the_gpu():
    fgraph, step = rewritten_step(IMAGENET, gpu_inputs=True, gpu_outputs=True)
    assert len(step.dropout_states) == 2
    advances = [
        type(n.op).__name__
        for n in fgraph.apply_nodes
        if "DropoutAdvance" in type(n.op).__name__
    ]
    assert advances == ["GpuDropoutAdvance"] * 2, advances


@pytest.mark.parametrize(
    "name,cfg,kwargs",
    [
        ("imagenet", IMAGENET, {}),
        ("imagenet-no-dropout", IMAGENET.with_(dropout=False), {}),
        ("imagenet-67-dropout", TINY_IMAGENET, {}),
        ("small", StepConfig("small", batch=16), {}),
        ("small-dynamic-batch", StepConfig("small", batch=16), {"static_batch": False}),
        ("cifar18", StepConfig("cifar18", batch=128), {}),
        ("cifar18-dynamic", StepConfig("cifar18", batch=16), {"static_batch": False}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_training_step_rewrites_to_gpu_ops_only(name, cfg, kwargs):
    fgraph, step = rewritten_step(cfg, **kwargs)
    dynamic = kwargs.get("static_batch") is False
    problems, transfers_in = check_gpu_step(fgraph, step, shape_scalars=dynamic)
    assert not problems, f"{name}: {len(problems)} problems:\n" + "\n".join(problems)
    if not dynamic:
        assert transfers_in == ["images", "labels"], transfers_in
    n_gpu = sum(isinstance(n.op, GpuOp) for n in fgraph.apply_nodes)
    assert n_gpu > 20, n_gpu


@pytest.mark.parametrize("cfg", [IMAGENET, StepConfig("cifar18", batch=128)],
                         ids=["imagenet", "cifar18"])  # fmt: skip
def test_step_with_gpu_inputs_and_outputs_has_no_transfers(cfg):
    fgraph, step = rewritten_step(cfg, gpu_inputs=True, gpu_outputs=True)
    problems, transfers_in = check_gpu_step(fgraph, step)
    assert not problems, "\n".join(problems)
    transfers = [
        describe(n)
        for n in fgraph.apply_nodes
        if isinstance(n.op, (GpuFromHost, HostFromGpu))
    ]
    assert not transfers, transfers
    requested = fgraph.outputs[: len(step.outputs)]
    assert all(isinstance(v.type, CudaArrayType) for v in requested), requested
