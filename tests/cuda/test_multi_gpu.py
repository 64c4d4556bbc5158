"""The multi-device rewrite on GPUs: structure (CPU-only) and equivalence (GPU).

On one GPU the equivalence runs K = 2 virtual labels (0 and 1 on physical 0):
the same 5 momentum-SGD steps as tests/distributed/test_hybrid.py, compared
with the single-device GPU run.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pytensor
import pytest
from pytensor.compile.rebuild import construct_function_ins_and_outs

import cc2ops
import cc2ops.cuda
from cc2ops.cuda.mode import MultiGpuMode
from cc2ops.cuda.ops.comm import GPU_COMM_OPS
from cc2ops.distributed import hybrid as mg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from test_hybrid import _net  # noqa: E402

F32 = np.float32


def _training(mode, k_distribute, seed=0):
    x, y, params, cost, _ = _net(seed)
    if k_distribute:
        cost = mg.distribute(cost, mode)
    grads = pytensor.grad(cost, params)
    updates = []
    for p, g in zip(params, grads, strict=True):
        m = pytensor.shared(np.zeros_like(p.get_value()), name="m_" + p.name)
        new_m = F32(0.9) * m - F32(0.05) * g
        updates += [(m, new_m), (p, p + new_m)]
    return x, y, params, cost, updates


def test_cuda_mode_with_two_labels_is_the_multi_gpu_mode():
    m = cc2ops.cuda.mode(devices=[0, 1], comm="virtual")
    assert isinstance(m, MultiGpuMode)
    assert m.backend.labels == (0, 1) and m.cc2ops_devices == (0, 1)
    assert isinstance(cc2ops.cuda.mode(0), cc2ops.cuda.mode.__globals__["GpuMode"])
    # what examples/imagenet/train.py checks for --device cuda --devices K
    for kwargs in ({"devices": [0, 1]}, {"device": 2, "devices": [2, 3, 4]}):
        m = cc2ops.cuda.mode(**kwargs)
        assert isinstance(m, mg.MultiDeviceMode), kwargs
        assert m.backend.n == len(kwargs["devices"]) and m.backend.impl == "auto"
    assert not isinstance(cc2ops.cuda.mode(0), mg.MultiDeviceMode)


def test_undistributed_model_is_refused_and_gpu_to_gpu_graphs_are_not():
    """No GPU needed: the maker refuses, or builds (linking would need CUDA)."""
    mode = cc2ops.cuda.mode(devices=[0, 1], comm="virtual")
    x, y, params, cost, updates = _training(mode, False)
    ins, outs = construct_function_ins_and_outs([x, y], cost, updates=updates)
    with pytest.raises(ValueError) as info:
        mode.function_maker(ins, outs, mode)
    msg = str(info.value)
    assert "MultiGpuMode with K=2 devices (labels (0, 1))" in msg, msg
    assert "distribute(cost, mode) before pytensor.grad" in msg, msg
    # a hand-written transfer between labels spans two devices: compiled as is
    v = cc2ops.cuda.CudaArrayType("float32", (None,), 0)("v")
    ins, outs = construct_function_ins_and_outs([v], cc2ops.cuda.gpu_to_gpu(v, 1))
    fg = mode.function_maker(ins, outs, mode).maker.fgraph
    assert any(type(n.op).__name__ == "GpuToGpu" for n in fg.apply_nodes)


def test_gpu_training_graph_is_lifted_with_gpu_collectives():
    """Rewritten and lifted without a GPU: the maker stops before linking."""
    mode = cc2ops.cuda.mode(devices=[0, 1], comm="virtual")
    x, y, params, cost, updates = _training(mode, True)
    ins, outs = construct_function_ins_and_outs([x, y], cost, updates=updates)
    fg = mode.function_maker(ins, outs, mode).maker.fgraph
    gpu_comm = Counter(
        (type(n.op).__name__, getattr(n.op, "axis", None))
        for n in fg.apply_nodes
        if isinstance(n.op, GPU_COMM_OPS)
    )
    assert gpu_comm == Counter(
        {
            ("GpuAllGather", 0): 1,
            ("GpuAllGather", 1): 2,
            ("GpuReduceScatter", 0): 1,
            ("GpuReduceScatter", 1): 2,
            ("GpuAllReduce", None): 2,
        }
    )
    ops = Counter(type(n.op).__name__ for n in fg.apply_nodes)
    for name in ("GpuFilterActs", "GpuWeightActs", "GpuSoftmaxCrossEntropy"):
        assert ops[name] == 2, (name, ops)
    assert ops["FilterActs"] == 0 and ops["SoftmaxCrossEntropy"] == 0
    devices = {
        n.outputs[0].type.device
        for n in fg.apply_nodes
        if type(n.op).__name__ == "GpuFilterActs"
    }
    assert devices == {0, 1}
    names = {v.name for v in fg.inputs}
    assert {"w1@0", "w1@1", "wf1@0", "wf1@1", "m_wf1@0", "m_wf1@1"} <= names


def _run(mode, distribute_it, steps=5, batch=6):
    x, y, params, cost, updates = _training(mode, distribute_it)
    fn = pytensor.function([x, y], cost, updates=updates, mode=mode)
    r = np.random.default_rng(1)
    data = r.normal(size=(batch, 3, 7, 7)).astype("float32")
    labels = r.integers(0, 5, size=batch).astype("int32")
    losses = [float(np.asarray(fn(data, labels))) for _ in range(steps)]
    return losses, [np.asarray(p.get_value()) for p in params]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [6, 7])
def test_two_virtual_labels_on_one_gpu_equal_the_single_gpu_run(monkeypatch, batch):
    from cc2ops.cuda import set_device_map

    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    cc2ops.cuda.set_allow_tf32(False)
    try:
        set_device_map({0: 0, 1: 0})
    except ValueError:
        pytest.skip("label 1 already in use on another physical device")
    ref_losses, ref_params = _run(cc2ops.cuda.mode(0), False, batch=batch)
    losses, params = _run(
        cc2ops.cuda.mode(devices=[0, 1], comm="virtual"), True, batch=batch
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6, err_msg="loss")
    for got, want in zip(params, ref_params, strict=True):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gpu_shared_parameters_with_static_shapes_are_localised():
    """Parameters made with cc2ops.cuda.shared(..., shape=...) (the example and the
    benchmark): parts keep the static shapes and the originals' stand-ins are
    GPU-typed; no host Gather of a parameter is left in the step."""
    mode = cc2ops.cuda.mode(devices=[0, 1], comm="virtual")
    x, y, host_params, _, _ = _net()
    x = pytensor.tensor.tensor("x", dtype="float32", shape=(None, 3, 7, 7))
    params = [
        cc2ops.cuda.shared(p.get_value(), name=p.name, shape=p.get_value().shape)
        for p in host_params
    ]
    w1, b1, wf1, bf1, wf2, bf2 = params
    h = cc2ops.conv2d(x, w1, padding=1) + b1.dimshuffle("x", 0, "x", "x")
    h = cc2ops.max_pool2d(pytensor.tensor.maximum(h, 0), 3, 2)
    f = pytensor.tensor.maximum(pytensor.tensor.dot(h.flatten(2), wf1) + bf1, 0)
    logits = pytensor.tensor.dot(f, wf2) + bf2
    cost = mg.distribute(cc2ops.softmax_cross_entropy(logits, y).mean(), mode)
    grads = pytensor.grad(cost, params)
    updates = [(p, p - F32(0.1) * g) for p, g in zip(params, grads, strict=True)]
    ins, outs = construct_function_ins_and_outs([x, y], cost, updates=updates)
    fg = mode.function_maker(ins, outs, mode).maker.fgraph
    ops = Counter(type(n.op).__name__ for n in fg.apply_nodes)
    assert ops["Gather"] == 0 and ops["Scatter"] == 2 and ops["Reduce"] == 1, ops
    shapes = {v.name: v.type.shape for v in fg.inputs if v.name}
    assert shapes["wf1@0"] == (36, 4) and shapes["wf1@1"] == (36, 4), shapes
    assert shapes["w1@1"] == (4, 3, 3, 3), shapes
