"""GPU convolution: lifting, validation, planning, autotuning (CPU) and kernels (GPU).

CPU tests build and rewrite graphs only: the lift of conv2d graphs and their
first and second gradients, the accumulation rewrite on the graph the GPU
mode would link, make_node errors, shape inference, chunk planning, kernel
names and the autotuner's choice and cache logic with a fake timer. GPU tests
(``gpu`` marker) run every algorithm forced individually over the shape
sweep and the five AlexNet layers against the float64 numpy reference, on
NaN-poisoned outputs, plus gradients through compiled GPU graphs, the
accumulating variants, c01b and a small ``sanitize`` set.
"""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import check_grad, rel_err, rng
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph

import cc2ops.cuda as cuda
from cc2ops.conv import (
    FilterActs,
    ImageActs,
    WeightActs,
    conv2d,
    conv_backward_data_reference,
    conv_backward_filter_reference,
    conv_forward_reference,
)
from cc2ops.cuda.ops import load_gpu_op_modules
from cc2ops.cuda.ops.conv import ops as gconv
from cc2ops.cuda.ops.conv.ops import (
    ConvGeometry,
    GpuFilterActs,
    GpuImageActs,
    GpuWeightActs,
    geometry_of,
    plan_chunk,
)
from cc2ops.cuda.runtime import autotune as at
from cc2ops.cuda.runtime.compile import all_variants
from cc2ops.cuda.type import CudaArrayType

F32, F64 = "float32", "float64"
cuda_mode = importlib.import_module("cc2ops.cuda.mode")
HOST_CONV = (FilterActs, ImageActs, WeightActs)
GPU_CONV = (GpuFilterActs, GpuImageActs, GpuWeightActs)


def gvar(shape=(None,) * 4, dtype=F32, name="x", device=0):
    return CudaArrayType(dtype, shape, device)(name)


def h(x):
    return cuda.host_from_gpu(x)


def lifted(outs):
    load_gpu_op_modules()
    outs = outs if isinstance(outs, list) else [outs]
    fg = FunctionGraph(outputs=outs, clone=False)
    rewrite_graph(fg, include=("fast_run", "cc2ops_gpu"), exclude=("inplace",))
    return fg


def classes(fg):
    return {type(n.op) for n in fg.apply_nodes}


class _Linked(Exception):
    pass


def linked_fgraph(monkeypatch, inputs, outputs):
    """The graph ``pytensor.function`` in the GPU mode would link (no CUDA used)."""
    seen = {}

    def stop():
        seen["fg"] = sys._getframe(1).f_locals["self"].fgraph
        raise _Linked

    monkeypatch.setattr(cuda_mode, "require", stop)
    with pytest.raises(_Linked):
        pytensor.function(inputs, outputs, mode=cuda.mode())
    return seen["fg"]


# --------------------------------------------------------------------------
# lifting (CPU)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stride, padding, groups", [(1, 0, 1), ((2, 1), (1, 2), 1), (1, 1, 2)]
)
def test_lift_conv2d_and_its_gradients(stride, padding, groups):
    xg = gvar((2, 4, 9, 8), name="x")
    wg = gvar((6, 4 // groups, 3, 2), name="w")
    y = conv2d(h(xg), h(wg), stride=stride, padding=padding, groups=groups)
    cost = (y**2).sum()
    gx, gw = pytensor.grad(cost, [xg, wg])
    fg = lifted([y, gx, gw])
    found = classes(fg)
    assert set(GPU_CONV) <= found, found
    assert not found & set(HOST_CONV), found
    for n in fg.apply_nodes:
        if isinstance(n.op, GPU_CONV):
            assert n.op.stride == FilterActs(stride=stride).stride
            assert n.op.groups == groups and n.op.precision is None
    assert gx.type.shape == xg.type.shape and gw.type.shape == wg.type.shape


def test_lift_second_derivative_stays_in_the_family():
    xg = gvar((2, 3, 7, 7), name="x")
    wg = gvar((4, 3, 3, 3), name="w")
    y = conv2d(h(xg), h(wg), padding=1)
    gx = pytensor.grad((y**2).sum(), xg)
    ggw = pytensor.grad((gx**2).sum(), wg)
    fg = lifted([ggw])
    found = classes(fg)
    assert not found & set(HOST_CONV), found
    assert {GpuFilterActs, GpuWeightActs} <= found, found


def test_gpu_pullbacks_build_gpu_ops():
    xg = gvar((2, 4, 6, 6), F64, "x")
    wg = gvar((4, 2, 3, 3), F64, "w")
    y = GpuFilterActs(groups=2, padding=1)(xg, wg)
    cost = (h(y) ** 2).sum()
    gx, gw = pytensor.grad(cost, [xg, wg])
    assert isinstance(gx.type, CudaArrayType) and gx.type.shape == xg.type.shape
    assert isinstance(gw.type, CudaArrayType) and gw.type.shape == wg.type.shape
    # the pullback graph builds GPU conv ops only
    fg = FunctionGraph(outputs=[gx, gw], clone=False)
    assert {GpuImageActs, GpuWeightActs} <= classes(fg)
    assert not classes(fg) & set(HOST_CONV)
    # and their pullbacks close the family (second order)
    g2 = pytensor.grad((h(gx) ** 2).sum() + (h(gw) ** 2).sum(), [xg, wg])
    fg2 = FunctionGraph(outputs=g2, clone=False)
    assert not classes(fg2) & set(HOST_CONV)
    assert {GpuFilterActs, GpuImageActs, GpuWeightActs} <= classes(fg2)


def test_lift_c01b_conv2d():
    xg = gvar((3, 9, 9, 2), name="x")  # (C, H, W, B)
    wg = gvar((3, 3, 3, 4), name="w")  # (C, kh, kw, F)
    y = conv2d(h(xg), h(wg), padding=1, layout="c01b")
    gx, gw = pytensor.grad((y**2).sum(), [xg, wg])
    fg = lifted([y, gx, gw])
    found = classes(fg)
    assert set(GPU_CONV) <= found and not found & set(HOST_CONV), found
    assert y.type.shape == (4, 9, 9, 2)


def test_host_conv_without_gpu_neighbours_stays_on_host():
    x = pt.tensor4("x")
    w = pt.tensor4("w")
    fg = lifted([conv2d(x, w)])
    assert FilterActs in classes(fg) and GpuFilterActs not in classes(fg)


# --------------------------------------------------------------------------
# accumulation rewrite (CPU)
# --------------------------------------------------------------------------


def _two_use_weight_grad():
    x1 = gvar((2, 3, 6, 6), name="x1")
    x2 = gvar((2, 3, 6, 6), name="x2")
    wg = gvar((4, 3, 3, 3), name="w")
    w = h(wg)
    cost = (conv2d(h(x1), w) ** 2).sum() + (conv2d(h(x2), w, padding=1) ** 2).sum()
    return [x1, x2, wg], pytensor.grad(cost, wg)


def test_accumulate_rewrite_on_the_linked_graph(monkeypatch):
    inputs, gw = _two_use_weight_grad()
    fg = linked_fgraph(monkeypatch, inputs, [gw])
    acc = [
        n for n in fg.apply_nodes if isinstance(n.op, GpuWeightActs) and n.op.accumulate
    ]
    assert len(acc) == 1, [str(n.op) for n in fg.apply_nodes]
    node = acc[0]
    assert node.op.destroy_map == {0: [3]}
    other = node.inputs[3].owner
    assert isinstance(other.op, GpuWeightActs) and not other.op.accumulate
    from cc2ops.cuda.ops.tensor.elemwise import GpuElemwise

    for n in fg.apply_nodes:
        if isinstance(n.op, GpuElemwise):
            assert not any(
                i.owner is not None and isinstance(i.owner.op, GpuWeightActs)
                for i in n.inputs
            ), str(n.op)


def test_accumulate_rewrite_leaves_protected_inputs_alone(monkeypatch):
    import pytensor.scalar as ps

    from cc2ops.cuda.ops.tensor.elemwise import GpuElemwise

    x = gvar((2, 3, 6, 6), name="x")
    dy = gvar((2, 4, 4, 4), name="dy")
    acc = gvar((4, 3, 3, 3), name="acc")
    dw = GpuWeightActs()(x, dy, np.array([3, 3]))
    out = GpuElemwise(ps.add)(acc, dw)
    fg = linked_fgraph(monkeypatch, [x, dy, acc], [h(out)])
    assert not [
        n for n in fg.apply_nodes if isinstance(n.op, GpuWeightActs) and n.op.accumulate
    ]


def test_accumulate_rewrite_is_registered_before_inplace_elemwise():
    from cc2ops.rewriting.db import gpu_inplace_db

    assert gconv.gpu_conv_accumulate in gpu_inplace_db.__db__["cc2ops_gpu"]
    pos = gpu_inplace_db.__position__
    assert pos["gpu_conv_accumulate"] < pos["gpu_inplace_elemwise"]


def test_accumulate_op_graph():
    x = gvar((2, 3, 6, 6), name="x")
    dy = gvar((2, 4, 4, 4), name="dy")
    acc = gvar((None, 3, 3, None), name="acc")
    op = GpuWeightActs(accumulate=True)
    out = op(x, dy, np.array([3, 3]), acc)
    assert out.type.shape == (4, 3, 3, 3)
    assert op.destroy_map == {0: [3]} and not GpuWeightActs().destroy_map
    assert op != GpuWeightActs()
    gx, gdy, gacc = pytensor.grad(h(out).sum(), [x, dy, acc])
    assert gacc.type.shape[1:3] == (3, 3)
    dyi = gvar((2, 4, 6, 6), name="dyi")
    acci = gvar((2, 3, 6, 6), name="acci")
    dx = GpuImageActs(accumulate=True, padding=1)(dyi, gvar((4, 3, 3, 3)), [6, 6], acci)
    assert dx.type.shape == (2, 3, 6, 6)


# --------------------------------------------------------------------------
# make_node validation and shape inference (CPU)
# --------------------------------------------------------------------------


def test_make_node_errors():
    x = gvar((2, 4, 8, 8))
    w = gvar((6, 2, 3, 3))
    with pytest.raises(TypeError, match="GpuFilterActs: images must be a GPU variable"):
        GpuFilterActs()(pt.tensor4("x"), w)
    with pytest.raises(TypeError, match=r"GpuFilterActs: filters must have 4 dims"):
        GpuFilterActs()(x, CudaArrayType(F32, (None,) * 3, 0)())
    with pytest.raises(TypeError, match="must share one float dtype"):
        GpuFilterActs(groups=2)(x, gvar((6, 2, 3, 3), F64))
    with pytest.raises(TypeError, match="must be float32 or float64"):
        GpuFilterActs()(x, CudaArrayType("int32", (6, 4, 3, 3), 0)())
    with pytest.raises(ValueError, match=r"filters have 2 input channels but images"):
        GpuFilterActs()(x, w)
    with pytest.raises(ValueError, match=r"groups \(3\) must divide the image"):
        GpuFilterActs(groups=3)(x, gvar((6, 2, 3, 3)))
    with pytest.raises(ValueError, match="inputs live on devices 0 and 1"):
        GpuFilterActs(groups=2)(x, gvar((6, 2, 3, 3), device=1))
    with pytest.raises(ValueError, match=r"filter rows \(9\) larger than the padded"):
        GpuFilterActs(groups=2)(x, gvar((6, 2, 9, 3)))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        GpuFilterActs(stride=0)
    with pytest.raises(ValueError, match="GpuFilterActs: precision must be None"):
        GpuFilterActs(precision="fp16")
    with pytest.raises(TypeError, match="accumulate must be a bool"):
        GpuWeightActs(accumulate=1)
    dy = gvar((2, 6, 6, 6))
    with pytest.raises(ValueError, match=r"gradient rows \(6\) do not match"):
        GpuImageActs(groups=2)(dy, w, np.array([9, 8]))
    with pytest.raises(ValueError, match="gradient has 6 channels but there are 5"):
        GpuImageActs()(dy, gvar((5, 4, 3, 3)), np.array([8, 8]))
    with pytest.raises(ValueError, match="image_hw must have 2 entries"):
        GpuImageActs(groups=2)(dy, w, np.array([8, 8, 8]))
    with pytest.raises(TypeError, match="takes 3 inputs"):
        GpuWeightActs()(x, dy, np.array([3, 3]), gvar((6, 4, 3, 3)))
    with pytest.raises(TypeError, match=r"takes 4 inputs \(the accumulator acc"):
        GpuWeightActs(accumulate=True)(x, dy, np.array([3, 3]))
    with pytest.raises(ValueError, match="acc has shape"):
        GpuWeightActs(accumulate=True)(x, dy, np.array([3, 3]), gvar((6, 4, 3, 2)))
    with pytest.raises(TypeError, match="acc has dtype"):
        GpuWeightActs(accumulate=True)(x, dy, [3, 3], gvar((6, 4, 3, 3), F64))
    with pytest.raises(ValueError, match=r"gradient batch \(3\) does not match"):
        GpuWeightActs()(x, gvar((3, 6, 6, 6)), np.array([3, 3]))


def test_infer_shape():
    x = gvar((None, 4, None, None))
    w = gvar((6, 2, 3, 5))
    node = GpuFilterActs(stride=(2, 1), padding=(1, 2), groups=2)(x, w).owner
    assert node.op._infer_shape(node, [(3, 4, 9, 7), (6, 2, 3, 5)]) == [(3, 6, 5, 7)]
    y = GpuFilterActs(stride=2, padding=1, groups=2)(gvar((2, 4, 9, 7)), w)
    assert y.type.shape == (2, 6, 5, 3)
    # static shapes flow through the gradients
    dx = GpuImageActs(stride=2, padding=1, groups=2)(
        gvar((2, 6, 5, 3)), w, np.array([9, 7])
    )
    assert dx.type.shape == (2, 4, 9, 7)
    xs, dys = gvar((None, 4, 9, 7)), gvar((None, 6, 5, 3))
    dw = GpuWeightActs(stride=2, padding=1, groups=2)(xs, dys, np.array([3, 5]))
    assert dw.type.shape == (6, 2, 3, 5)
    # the rule itself, on the graph the shape feature would hand it
    node = dw.owner
    got = node.op._infer_shape(node, [(5, 4, 9, 7), (5, 6, 5, 3), (2,)])[0]
    assert [int(pt.as_tensor_variable(d).eval()) for d in got] == [6, 2, 3, 5]
    node = dx.owner
    got = node.op._infer_shape(node, [(2, 6, 5, 3), (6, 2, 3, 5), (2,)])[0]
    assert [int(pt.as_tensor_variable(d).eval()) for d in got] == [2, 4, 9, 7]
    acc = GpuWeightActs(stride=2, padding=1, groups=2, accumulate=True)(
        xs, dys, np.array([3, 5]), gvar()
    )
    node = acc.owner
    assert node.op._infer_shape(node, [(), (), (), (6, 2, 3, 5)]) == [(6, 2, 3, 5)]


def test_geometry_of():
    g = geometry_of("t", (129, 64, 27, 27), (192, 64, 5, 5), (1, 1), (2, 2), 1)
    assert g == ConvGeometry(129, 64, 27, 27, 192, 5, 5, 1, 1, 2, 2, 1, 27, 27)
    g = geometry_of("t", (2, 4, 9, 7), (6, 2, 3, 5), (2, 1), (1, 2), 2)
    assert (g.out_h, g.out_w, g.groups) == (5, 7, 2)
    with pytest.raises(ValueError, match="t: groups"):
        geometry_of("t", (2, 4, 9, 7), (6, 2, 3, 5), (1, 1), (0, 0), 3)


def test_plan_chunk():
    g = ConvGeometry(128, 192, 13, 13, 384, 3, 3, 1, 1, 1, 1, 1, 13, 13)
    per_image = 192 * 9 * 169 * 4
    nb = plan_chunk(g, 4, 32 << 20)
    room = (32 << 20) // per_image  # 28 images: 5 chunks
    balanced = -(-128 // -(-128 // room))  # 26
    # balanced, then rounded up to a multiple of 4 for 16-byte GEMM rows
    # (169 pixels per image): 28
    assert balanced == 26 and nb == 28 and nb * per_image <= 32 << 20
    assert plan_chunk(g, 4, 1 << 40) == 128
    assert plan_chunk(g, 4, 1) == 1  # 4 images would be far past the budget
    assert plan_chunk(g, 4, 5 * per_image) == 4  # down from 5 to a multiple of 4
    g129 = ConvGeometry(129, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 8, 8)
    room = 64 * 3 * 9 * 64 * 4
    assert plan_chunk(g129, 4, room) == 43
    assert plan_chunk(g129, 8, room) == 26  # float64: room for 32, 5 chunks
    huge = ConvGeometry(2, 1024, 2048, 2048, 8, 1, 1, 1, 1, 0, 0, 1, 2048, 2048)
    with pytest.raises(ValueError, match="above the 2\\^31 limit"):
        plan_chunk(huge, 4, 32 << 20)


@pytest.mark.parametrize("layer", ["conv2", "conv3", "conv4", "conv5"])
@pytest.mark.parametrize("budget_mib", [8, 32, 128])
def test_plan_chunk_aligns_gemm_rows(layer, budget_mib):
    # nb * Ho*Wo is the leading dimension of the im2col GEMMs: 16-byte rows
    # (43 images of 13x13 gave 7267 floats; 44 give 7436)
    c, f, hw, k, pad = {
        "conv2": (64, 192, 27, 5, 2), "conv3": (192, 384, 13, 3, 1),
        "conv4": (384, 256, 13, 3, 1), "conv5": (256, 256, 13, 3, 1),
    }[layer]  # fmt: skip
    g = ConvGeometry(128, c, hw, hw, f, k, k, 1, 1, pad, pad, 1, hw, hw)
    budget = budget_mib << 20
    nb = plan_chunk(g, 4, budget)
    per_image = c * k * k * hw * hw * 4
    if 4 * per_image * 4 > budget * 5:
        # conv2 at 8 MiB: one image of columns (4.7 MB) fits, four would be
        # 2.2 times the budget: left at one image, unaligned
        assert (layer, budget_mib, nb) == ("conv2", 8, 1)
        return
    assert 1 < nb < 128 and nb * hw * hw % 4 == 0
    # the rounding passes the budget by at most a quarter
    assert nb * per_image * 4 <= budget * 5
    assert plan_chunk(g, 8, budget) * hw * hw % 2 == 0  # float64: 16 bytes too
    if budget_mib == 128 and layer == "conv4":
        assert nb == 44  # three chunks (44, 44, 40), where balancing gave 43


def test_plan_chunk_alignment_yields_to_the_index_limit():
    # outputs of ~2^31/5 elements per image: at most 5 images per chunk, and
    # with an odd Ho*Wo the rounding goes down to 4, not up to 8
    f = (2**31 - 1) // 5 // 169
    g = ConvGeometry(14, 1, 13, 13, f, 1, 1, 1, 1, 0, 0, 1, 13, 13)
    assert (2**31 - 1) // (f * 169) == 5
    assert plan_chunk(g, 4, 1 << 40) == 4
    # one chunk holds the whole batch: no rounding (nothing to choose)
    g1 = ConvGeometry(3, 1, 13, 13, 8, 1, 1, 1, 1, 0, 0, 1, 13, 13)
    assert plan_chunk(g1, 4, 1 << 40) == 3


def test_algorithm_names():
    g = ConvGeometry(4, 8, 9, 9, 6, 3, 3, 1, 1, 1, 1, 2, 9, 9)
    fwd = gconv.algorithm_names("filter_acts", g, np.float64)
    assert fwd[0] == gconv.DEFAULT_ALGORITHM
    assert {"im2col_knp_8m", "im2col_knp_128m", "im2col_nkp_32m"} <= set(fwd)
    assert not any(n.startswith("igemm") for n in fwd)  # float64
    wgt = gconv.algorithm_names("weight_acts", g, np.float64)
    assert "im2col_nkp_32m" not in wgt and wgt[0] == gconv.DEFAULT_ALGORITHM
    with pytest.raises(ValueError, match="op must be one of"):
        gconv.algorithm_names("conv", g, np.float32)


def test_precision_resolution():
    assert gconv.resolve_precision(np.float64, "tf32") == "fp64"
    assert gconv.resolve_precision(np.float32, "tf32") == "tf32"
    with cuda.allow_tf32(True):
        assert gconv.resolve_precision(np.float32, None) == "tf32"
    with cuda.allow_tf32(False):
        assert gconv.resolve_precision(np.float32, None) == "fp32"
    with pytest.raises(ValueError, match="precision must be"):
        gconv.resolve_precision(np.float32, "bf16")


def test_kernel_names_and_variants():
    g = ConvGeometry(1, 64, 27, 27, 192, 5, 5, 1, 1, 2, 2, 1, 27, 27)
    assert gconv._tap_consts("im2col", g, F32, "knp")["name"] == "im2col_k5x5_s1_p2_f32"
    rect = ConvGeometry(1, 4, 9, 7, 4, 2, 3, 2, 1, 1, 0, 2, 5, 5)
    name = gconv._tap_consts("col2im", rect, F64, "nkp", True)["name"]
    assert name == "col2im_k2x3_s2x1_p1x0_f64_nkp_acc"
    assert gconv._helper_consts("swap01", F32)["name"] == "swap01_f32"
    load_gpu_op_modules()
    names = {c["name"] for f, c in all_variants() if f == "conv_im2col"}
    assert {"im2col_k5x5_s1_p2_f32", "swap01_f32", "add_f64"} <= names


# --------------------------------------------------------------------------
# autotuner (CPU, fake timer)
# --------------------------------------------------------------------------

KEY = {"op": "GpuFilterActs", "geometry": [1, 2, 3], "device": "Fake GPU 9"}


class FakeTimer:
    def __init__(self, times):
        self.times = times
        self.calls = []

    def __call__(self, fn, device):
        fn()
        self.calls.append(self.current)
        return self.times[self.current]


def make_candidates(timer, values):
    """Candidates writing ``values[name]`` into a numpy scratch buffer."""
    runs = {}
    for name, value in values.items():

        def run(out, name=name, value=value):
            timer.current = name
            out[...] = value

        runs[name] = run
    return runs


def scratch():
    return np.full(4, np.nan)


def test_autotuner_picks_the_fastest_correct(tmp_path, monkeypatch):
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    timer = FakeTimer({"a": 3.0, "b": 1.0, "c": 2.0, "wrong": 0.1, "boom": 0.1})
    good = np.arange(4.0) + 1
    values = {"a": good, "b": good * (1 + 1e-7), "c": good, "wrong": good * 1.1}
    cands = make_candidates(timer, values)

    def boom(out):
        raise RuntimeError("kernel failed")

    cands["boom"] = boom
    tuner = at.Autotuner("conv", timer=timer, directory=tmp_path)
    choice = tuner.select(
        KEY, cands, default="a", scratch=scratch, tolerance=1e-5, device=0
    )
    assert choice == "b"
    rec = tuner.records[at.key_string(KEY)]
    assert "wrong" in rec["rejected"] and "differs" in rec["rejected"]["wrong"]
    assert "kernel failed" in rec["rejected"]["boom"]
    assert set(rec["times_ms"]) == {"a", "b", "c"}
    path = at.cache_path("Fake GPU 9", tmp_path)
    assert path.name == "autotune-fake-gpu-9.json"
    doc = json.loads(path.read_text())
    assert doc["entries"][at.key_string(KEY)]["choice"] == "b"
    # a second call does not time again
    n = len(timer.calls)
    assert tuner.select(KEY, cands, default="a", scratch=scratch, tolerance=1e-5) == "b"
    assert len(timer.calls) == n

    # a fresh tuner (another process) reads the file and never times
    def no_timer(fn, device):
        raise AssertionError("timed although cached")

    fresh = at.Autotuner("conv", timer=no_timer, directory=tmp_path)
    assert fresh.select(KEY, cands, default="a", scratch=scratch, tolerance=1e-5) == "b"
    # a cached choice that is no longer a candidate is tuned again
    fewer = {k: v for k, v in cands.items() if k != "b"}
    other = at.Autotuner("conv", timer=timer, directory=tmp_path)
    assert other.select(KEY, fewer, default="a", scratch=scratch, tolerance=1e-5) == "c"


def test_autotuner_disabled_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv(at.AUTOTUNE_ENV, "0")

    def no_timer(fn, device):
        raise AssertionError("timed although disabled")

    timer = FakeTimer({})
    cands = make_candidates(timer, {"a": np.ones(4), "b": np.ones(4)})
    tuner = at.Autotuner("conv", timer=no_timer, directory=tmp_path)
    assert tuner.select(KEY, cands, default="a", scratch=scratch, tolerance=1) == "a"
    assert not list(tmp_path.iterdir())
    assert not at.autotune_enabled()
    monkeypatch.setenv(at.AUTOTUNE_ENV, "1")
    assert at.autotune_enabled()


def test_autotuner_non_finite_reference_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    timer = FakeTimer({"a": 2.0, "b": 1.0})
    bad = np.array([1.0, np.nan, 0, 0])
    cands = make_candidates(timer, {"a": bad, "b": bad})
    tuner = at.Autotuner("conv", timer=timer, directory=tmp_path)
    assert tuner.select(KEY, cands, default="a", scratch=scratch, tolerance=1) == "a"
    assert tuner.cached(KEY) is None and not timer.calls


def test_autotuner_tolerates_a_corrupt_file_and_merges(tmp_path, monkeypatch):
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    path = at.cache_path("Fake GPU 9", tmp_path)
    path.write_text("{not json")
    timer = FakeTimer({"a": 2.0, "b": 1.0})
    cands = make_candidates(timer, {"a": np.ones(4), "b": np.ones(4)})
    t1 = at.Autotuner("conv", timer=timer, directory=tmp_path)
    assert t1.select(KEY, cands, default="a", scratch=scratch, tolerance=1e-5) == "b"
    # another process adds a key meanwhile; writes merge, nothing is lost
    key2 = dict(KEY, geometry=[4, 5, 6])
    t2 = at.Autotuner("conv", timer=timer, directory=tmp_path)
    assert t2.select(key2, cands, default="a", scratch=scratch, tolerance=1e-5) == "b"
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {at.key_string(KEY), at.key_string(key2)}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # ties go to the default
    timer.times = {"a": 1.0, "b": 1.0}
    key3 = dict(KEY, geometry=[7])
    assert t2.select(key3, cands, default="a", scratch=scratch, tolerance=1e-5) == "a"
    with pytest.raises(ValueError, match="default 'z' is not a candidate"):
        t2.select(key3, cands, default="z", scratch=scratch, tolerance=1e-5)


def test_autotuner_uses_fresh_scratch_per_candidate(tmp_path, monkeypatch):
    """Accumulating candidates would double-apply into a shared buffer."""
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    made = []

    def fresh():
        out = np.zeros(4)
        made.append(out)
        return out

    def acc_a(out):
        out += 1.0

    def acc_b(out):
        out += 1.0

    tuner = at.Autotuner("conv", timer=lambda fn, d: 1.0, directory=tmp_path)
    tuner.select(
        KEY, {"a": acc_a, "b": acc_b}, default="a", scratch=fresh, tolerance=1e-12
    )
    assert len(made) == 2 and made[0] is not made[1]
    assert "b" not in tuner.records[at.key_string(KEY)]["rejected"]


# --------------------------------------------------------------------------
# the algorithms' orchestration on a numpy stand-in backend (CPU)
# --------------------------------------------------------------------------


class NumpyBackend:
    """numpy versions of the GPU primitives the im2col algorithms call.

    GPUArrays become numpy arrays (views keep numpy's offsets and strides);
    each kernel is reimplemented from its specification in
    ``kernels/conv_im2col.cu`` and cuBLAS from ``cc2ops.cuda.libs.cublas``'s
    docstrings. What this checks is the Python side: chunking, buffer views,
    GEMM shapes, transposes and layouts, beta handling.
    """

    def __init__(self, monkeypatch):
        from cc2ops.cuda.libs import cublas as blas
        from cc2ops.cuda.runtime import array

        mp = monkeypatch
        mp.setattr(array, "view", self.view)
        mp.setattr(gconv, "_im2col", self.im2col)
        mp.setattr(gconv, "_col2im", self.col2im)
        mp.setattr(gconv, "_swap01", self.swap01)
        mp.setattr(gconv, "_add_into", self.add_into)
        mp.setattr(array, "empty", lambda shape, dt, dev: np.full(shape, np.nan, dt))
        mp.setattr(array, "fill", self.fill)
        mp.setattr(array, "ascontiguous", lambda a, d=None: np.ascontiguousarray(a))
        mp.setattr(array, "is_c_contiguous", lambda a: a.flags.c_contiguous)
        mp.setattr(array, "copy", lambda a, d=None: np.array(a, order="C"))
        mp.setattr(blas, "gemm", self.gemm)
        mp.setattr(blas, "gemm_strided_batched", self.gemm_batched)
        self.gemms = 0

    @staticmethod
    def view(base, offset, shape, strides):
        assert base.flags.c_contiguous
        flat = base.reshape(-1)[offset:]
        item = base.dtype.itemsize
        out = np.lib.stride_tricks.as_strided(
            flat, shape, tuple(s * item for s in strides)
        )
        # every element of the view lies inside the buffer
        last = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        assert min(shape) == 0 or last < flat.size, (offset, shape, strides)
        return out

    @staticmethod
    def fill(a, value, device=None):
        a[...] = value
        return a

    @staticmethod
    def _taps(x, g):
        xp = np.pad(x, ((0, 0), (0, 0), (g.pad_h,) * 2, (g.pad_w,) * 2))
        win = np.lib.stride_tricks.sliding_window_view(xp, (g.kh, g.kw), axis=(2, 3))
        return win[:, :, :: g.stride_h, :: g.stride_w][:, :, : g.out_h, : g.out_w]

    def im2col(self, x, cols, n, g, layout, device):
        win = self._taps(x.reshape(n, g.channels, g.height, g.width), g)
        # (n, C, Ho, Wo, kh, kw) -> knp (C, kh, kw, n, Ho, Wo) / nkp (n, C, kh, kw, ..)
        order = (1, 4, 5, 0, 2, 3) if layout == "knp" else (0, 1, 4, 5, 2, 3)
        part = win.transpose(order).reshape(-1)
        cols.reshape(-1)[: part.size] = part

    def col2im(self, cols, dx, n, g, layout, accumulate, device):
        c, kh, kw, ho, wo = g.channels, g.kh, g.kw, g.out_h, g.out_w
        size = n * c * kh * kw * ho * wo
        flat = cols.reshape(-1)[:size]
        if layout == "knp":
            taps = flat.reshape(c, kh, kw, n, ho, wo).transpose(3, 0, 1, 2, 4, 5)
        else:
            taps = flat.reshape(n, c, kh, kw, ho, wo)
        hp, wp = g.height + 2 * g.pad_h, g.width + 2 * g.pad_w
        full = np.zeros((n, c, hp, wp), dx.dtype)
        for u in range(kh):
            for v in range(kw):
                full[
                    :, :, u : u + (ho - 1) * g.stride_h + 1 : g.stride_h,
                    v : v + (wo - 1) * g.stride_w + 1 : g.stride_w,
                ] += taps[:, :, u, v]  # fmt: skip
        inner = full[:, :, g.pad_h : g.pad_h + g.height, g.pad_w : g.pad_w + g.width]
        out = dx.reshape(n, c, g.height, g.width)
        if accumulate:
            out += inner
        else:
            out[...] = inner

    @staticmethod
    def swap01(src, dst, a, b, p, device):
        n = a * b * p
        part = src.reshape(-1)[:n].reshape(a, b, p).transpose(1, 0, 2).reshape(-1)
        dst.reshape(-1)[:n] = part

    @staticmethod
    def add_into(src, dst, device):
        dst += src

    def gemm(self, a, b, c=None, *, trans_a=False, trans_b=False, alpha=1.0,
             beta=0.0, device, precision=None):  # fmt: skip
        self.gemms += 1
        prod = (a.T if trans_a else a) @ (b.T if trans_b else b)
        c[...] = alpha * prod + (beta * c if beta else 0)
        return c

    def gemm_batched(self, a, b, c=None, *, trans_a=False, trans_b=False,
                     alpha=1.0, beta=0.0, device, precision=None):  # fmt: skip
        self.gemms += 1
        oa = a.transpose(0, 2, 1) if trans_a else a
        ob = b.transpose(0, 2, 1) if trans_b else b
        prod = np.matmul(oa, ob)
        assert prod.shape == c.shape, (prod.shape, c.shape)
        c[...] = alpha * prod + (beta * c if beta else 0)
        return c


NUMPY_CASES = [
    (1, 1, 2, (7, 7), (3, 3), (1, 1), (0, 0), 1),
    (5, 3, 4, (8, 6), (3, 2), (2, 1), (1, 0), 1),
    (7, 4, 6, (9, 8), (3, 3), (1, 1), (1, 1), 2),
    (3, 8, 8, (10, 7), (2, 3), (2, 3), (1, 2), 4),
    (6, 6, 4, (6, 6), (1, 1), (1, 1), (0, 0), 2),
]


@pytest.mark.parametrize("case", NUMPY_CASES, ids=[str(c[:4]) for c in NUMPY_CASES])
def test_algorithms_on_a_numpy_backend(case, monkeypatch):
    backend = NumpyBackend(monkeypatch)
    # budgets small enough that the batch is cut into several uneven chunks
    monkeypatch.setattr(gconv, "plan_chunk", lambda g, item, budget: min(
        g.batch, 2 if budget <= 8 << 20 else 3))  # fmt: skip
    b, c, f, hw, khw, stride, padding, groups = case
    x, w, dy = (a.astype(F64) for a in _case(*case))
    refs = _references(x, w, dy, hw, khw, stride, padding, groups)
    params = dict(stride=stride, padding=padding, groups=groups)
    g = geometry_of("test", x.shape, w.shape, stride, padding, groups)
    for name in PASSES:
        algs = [a for a in gconv.algorithm_names(name, g, np.float64)]
        assert len(algs) >= 3
        for alg in algs:
            got = _run_pass(name, x, w, dy, hw, khw, params, alg, None)
            err = rel_err(got, refs[name])
            assert err < 1e-12, f"{case} {name} {alg}: rel err {err:.3g}"
    for name, fn, args in (
        ("weight_acts", gconv.weight_acts, (x, dy, khw)),
        ("image_acts", gconv.image_acts, (dy, w, hw)),
    ):
        for alg in gconv.algorithm_names(name, g, np.float64):
            acc = rng(9).standard_normal(refs[name].shape)
            want = refs[name] + acc
            out = fn(*args, **params, algorithm=alg, acc=acc)
            assert out is acc
            assert rel_err(out, want) < 1e-12, f"{case} {name} {alg} accumulate"
    assert backend.gemms > 0
    with pytest.raises(ValueError, match="does not apply here"):
        gconv.weight_acts(x, dy, khw, **params, algorithm="im2col_nkp_32m")


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

# (batch, channels, filters, image hw, filter hw, stride, padding, groups)
SWEEP = [
    (1, 1, 2, (7, 7), (3, 3), (1, 1), (0, 0), 1),
    (3, 3, 4, (8, 6), (3, 2), (1, 1), (1, 0), 1),
    (129, 5, 6, (6, 7), (3, 3), (2, 2), (1, 1), 1),
    (3, 64, 32, (9, 9), (3, 3), (1, 1), (1, 1), 1),
    (2, 4, 6, (9, 8), (3, 3), (1, 1), (1, 1), 2),
    (3, 8, 8, (10, 7), (2, 3), (2, 1), (1, 2), 4),
    (2, 6, 4, (11, 9), (5, 3), (3, 2), (2, 1), 2),
    (3, 16, 24, (5, 5), (1, 1), (1, 1), (0, 0), 1),
    (2, 8, 8, (6, 6), (1, 1), (1, 1), (0, 0), 4),
]
ALEXNET = [
    ("conv1", 3, 64, 224, 11, 4, 0),
    ("conv2", 64, 192, 27, 5, 1, 2),
    ("conv3", 192, 384, 13, 3, 1, 1),
    ("conv4", 384, 256, 13, 3, 1, 1),
    ("conv5", 256, 256, 13, 3, 1, 1),
]
TOL = {"fp32": 1e-5, "tf32": 5e-3}
PASSES = ("filter_acts", "image_acts", "weight_acts")


def _case(b, c, f, hw, khw, stride, padding, groups, seed=0):
    r = rng(seed)
    x = r.standard_normal((b, c, *hw)).astype(F32)
    w = r.standard_normal((f, c // groups, *khw)).astype(F32)
    ho = (hw[0] + 2 * padding[0] - khw[0]) // stride[0] + 1
    wo = (hw[1] + 2 * padding[1] - khw[1]) // stride[1] + 1
    dy = r.standard_normal((b, f, ho, wo)).astype(F32)
    return x, w, dy


def _references(x, w, dy, hw, khw, stride, padding, groups):
    x64, w64, dy64 = (a.astype(F64) for a in (x, w, dy))
    return {
        "filter_acts": conv_forward_reference(x64, w64, stride, padding, groups),
        "image_acts": conv_backward_data_reference(
            dy64, w64, hw, stride, padding, groups
        ),
        "weight_acts": conv_backward_filter_reference(
            x64, dy64, khw, stride, padding, groups
        ),
    }


def _run_pass(name, gx, gw, gdy, hw, khw, params, algorithm, precision, dtype=F32):
    fn = getattr(gconv, name)
    if name == "filter_acts":
        return fn(gx, gw, **params, precision=precision, algorithm=algorithm)
    if name == "image_acts":
        return fn(gdy, gw, hw, **params, precision=precision, algorithm=algorithm)
    return fn(gx, gdy, khw, **params, precision=precision, algorithm=algorithm)


def _check_every_algorithm(case, precisions, label, monkeypatch):
    from cc2ops.cuda.runtime import array

    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    b, c, f, hw, khw, stride, padding, groups = case
    x, w, dy = _case(*case)
    refs = _references(x, w, dy, hw, khw, stride, padding, groups)
    gx, gw, gdy = (array.to_gpu(a, 0) for a in (x, w, dy))
    params = dict(stride=stride, padding=padding, groups=groups)
    g = geometry_of("test", x.shape, w.shape, stride, padding, groups)
    for name in PASSES:
        for precision in precisions:
            algs = gconv.algorithm_names(name, g, np.float32, precision)
            assert algs[0] == gconv.DEFAULT_ALGORITHM
            for alg in algs:
                out = _run_pass(name, gx, gw, gdy, hw, khw, params, alg, precision)
                got = array.to_host(out)
                where = f"{label} {name} {alg} {precision}"
                assert got.shape == refs[name].shape, where
                assert got.dtype == np.float32, where
                assert np.isfinite(got).all(), f"{where}: non-finite output"
                err = rel_err(got, refs[name])
                assert err < TOL[precision], f"{where}: rel err {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", SWEEP, ids=[f"sweep{i}" for i in range(len(SWEEP))])
def test_sweep_every_algorithm(case, monkeypatch):
    _check_every_algorithm(case, ("fp32", "tf32"), str(case), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ALEXNET, ids=[a[0] for a in ALEXNET])
def test_alexnet_layers_every_algorithm(layer, monkeypatch):
    name, c, f, hw, k, s, p = layer
    case = (32, c, f, (hw, hw), (k, k), (s, s), (p, p), 1)
    _check_every_algorithm(case, ("fp32", "tf32"), name, monkeypatch)


@pytest.mark.gpu
def test_float64_every_algorithm(monkeypatch):
    from cc2ops.cuda.runtime import array

    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    case = (3, 6, 4, (9, 7), (3, 2), (2, 1), (1, 1), 2)
    b, c, f, hw, khw, stride, padding, groups = case
    x, w, dy = (a.astype(F64) for a in _case(*case))
    refs = _references(x, w, dy, hw, khw, stride, padding, groups)
    gx, gw, gdy = (array.to_gpu(a, 0) for a in (x, w, dy))
    params = dict(stride=stride, padding=padding, groups=groups)
    g = geometry_of("test", x.shape, w.shape, stride, padding, groups)
    for name in PASSES:
        for alg in gconv.algorithm_names(name, g, np.float64):
            got = array.to_host(
                _run_pass(name, gx, gw, gdy, hw, khw, params, alg, None)
            )
            assert got.dtype == np.float64
            err = rel_err(got, refs[name])
            assert err < 1e-12, f"{name} {alg}: rel err {err:.3g}"


@pytest.mark.gpu
def test_accumulate_every_algorithm(monkeypatch):
    from cc2ops.cuda.runtime import array

    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    case = (5, 4, 6, (8, 7), (3, 3), (1, 2), (1, 0), 2)
    b, c, f, hw, khw, stride, padding, groups = case
    x, w, dy = _case(*case)
    refs = _references(x, w, dy, hw, khw, stride, padding, groups)
    gx, gw, gdy = (array.to_gpu(a, 0) for a in (x, w, dy))
    params = dict(stride=stride, padding=padding, groups=groups)
    g = geometry_of("test", x.shape, w.shape, stride, padding, groups)
    r = rng(3)
    for name, fn, args in (
        ("weight_acts", gconv.weight_acts, (gx, gdy, khw)),
        ("image_acts", gconv.image_acts, (gdy, gw, hw)),
    ):
        for alg in gconv.algorithm_names(name, g, np.float32, "fp32"):
            acc0 = r.standard_normal(refs[name].shape).astype(F32)
            acc = array.to_gpu(acc0, 0)
            out = fn(*args, **params, precision="fp32", algorithm=alg, acc=acc)
            assert out is acc, f"{name} {alg}: not written in place"
            err = rel_err(array.to_host(out), refs[name] + acc0)
            assert err < 1e-5, f"{name} {alg} accumulate: rel err {err:.3g}"
    # a non-contiguous accumulator is copied, not written through
    base = array.to_gpu(np.zeros((f, c // groups, 3, 6), F32), 0)
    view = base[:, :, :, ::2]
    out = gconv.weight_acts(gx, gdy, khw, **params, acc=view)
    assert out is not view
    assert np.all(array.to_host(base) == 0)
    assert rel_err(array.to_host(out), refs["weight_acts"]) < 1e-5


@pytest.mark.gpu
def test_accumulate_in_a_compiled_graph():
    inputs, gw = _two_use_weight_grad()
    fn = pytensor.function(inputs, h(gw), mode=cuda.mode())
    assert any(
        isinstance(n.op, GpuWeightActs) and n.op.accumulate
        for n in fn.maker.fgraph.apply_nodes
    )
    r = rng(1)
    x1, x2 = (r.standard_normal((2, 3, 6, 6)).astype(F32) for _ in range(2))
    w = r.standard_normal((4, 3, 3, 3)).astype(F32)
    y1 = conv_forward_reference(x1, w)
    y2 = conv_forward_reference(x2, w, padding=1)
    want = conv_backward_filter_reference(x1, 2 * y1, (3, 3)) + (
        conv_backward_filter_reference(x2, 2 * y2, (3, 3), padding=1)
    )
    got = fn(x1, x2, w)
    assert rel_err(got, want) < 1e-5


def _gpu_in(v):
    return h(cuda.gpu_from_host(v, 0))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "stride, padding, groups", [(1, 1, 1), ((2, 1), (0, 1), 2)], ids=["s1", "s2g2"]
)
def test_verify_grad_through_gpu_ops(stride, padding, groups):
    r = rng(2)
    x = r.standard_normal((2, 4, 6, 5))
    w = r.standard_normal((4, 4 // groups, 3, 2))
    mode = cuda.mode()

    def build(xv, wv):
        return conv2d(_gpu_in(xv), _gpu_in(wv), stride, padding, groups)

    xs, ws = pt.tensor4("x", dtype=F64), pt.tensor4("w", dtype=F64)
    fn = pytensor.function([xs, ws], pytensor.grad((build(xs, ws) ** 2).sum(), ws),
                           mode=mode)  # fmt: skip
    found = classes(fn.maker.fgraph)
    assert {GpuFilterActs, GpuWeightActs} <= found and not found & set(HOST_CONV)
    for i, label in ((0, "x"), (1, "w")):
        check_grad(build, [x, w], i, label=f"gpu conv: pullback wrt {label}",
                   mode=mode)  # fmt: skip


@pytest.mark.gpu
def test_second_derivative_through_gpu_ops():
    r = rng(4)
    x = r.standard_normal((2, 3, 5, 5))
    w = r.standard_normal((2, 3, 3, 3))
    mode = cuda.mode()

    def grad_x(xv, wv):
        y = conv2d(_gpu_in(xv), _gpu_in(wv), padding=1)
        return pytensor.grad((y**2).sum(), xv)

    def grad_w(xv, wv):
        y = conv2d(_gpu_in(xv), _gpu_in(wv), stride=2)
        return pytensor.grad((y**2).sum(), wv)

    # the graphs are linear in the perturbed input, so verify_grad's one-sided
    # differences (eps 1e-7) are limited by rounding of the cost: the host path
    # needs the same 1e-5 on these shapes
    tol = dict(abs_tol=1e-5, rel_tol=1e-5)
    for build in (grad_x, grad_w):
        for i in (0, 1):
            label = f"{build.__name__} wrt {i}"
            check_grad(build, [x, w], i, label=label, mode=mode, tol=tol)


@pytest.mark.gpu
def test_c01b_in_gpu_mode():
    r = rng(5)
    x = r.standard_normal((3, 9, 8, 2)).astype(F32)  # (C, H, W, B)
    w = r.standard_normal((3, 3, 2, 4)).astype(F32)  # (C, kh, kw, F)
    xs, ws = pt.tensor4("x", dtype=F32), pt.tensor4("w", dtype=F32)
    y = conv2d(_gpu_in(xs), _gpu_in(ws), padding=1, layout="c01b")
    gx, gw = pytensor.grad((y**2).sum(), [xs, ws])
    fn = pytensor.function([xs, ws], [y, gx, gw], mode=cuda.mode())
    assert set(GPU_CONV) <= classes(fn.maker.fgraph)
    got_y, got_gx, got_gw = (np.asarray(a) for a in fn(x, w))
    xb = x.transpose(3, 0, 1, 2).astype(F64)
    wb = w.transpose(3, 0, 1, 2).astype(F64)
    yb = conv_forward_reference(xb, wb, padding=1)
    assert rel_err(got_y, yb.transpose(1, 2, 3, 0)) < 1e-5
    gxb = conv_backward_data_reference(2 * yb, wb, (9, 8), padding=1)
    gwb = conv_backward_filter_reference(xb, 2 * yb, (3, 2), padding=1)
    assert rel_err(got_gx, gxb.transpose(1, 2, 3, 0)) < 1e-5
    assert rel_err(got_gw, gwb.transpose(1, 2, 3, 0)) < 1e-5


@pytest.mark.gpu
def test_autotune_on_the_device(tmp_path, monkeypatch):
    from cc2ops.cuda.runtime import array

    monkeypatch.setenv("CC2OPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    monkeypatch.setattr(gconv, "_TUNER", None)
    case = (8, 16, 32, (12, 12), (3, 3), (1, 1), (1, 1), 1)
    x, w, dy = _case(*case)
    gx, gw = array.to_gpu(x, 0), array.to_gpu(w, 0)
    got = array.to_host(gconv.filter_acts(gx, gw, padding=1, precision="fp32"))
    want = conv_forward_reference(x.astype(F64), w.astype(F64), padding=1)
    assert rel_err(got, want) < 1e-5
    files = list(tmp_path.glob("autotune-*.json"))
    assert len(files) == 1
    (entry,) = json.loads(files[0].read_text())["entries"].values()
    g = geometry_of("t", x.shape, w.shape, (1, 1), (1, 1), 1)
    assert entry["choice"] in gconv.algorithm_names(
        "filter_acts", g, np.float32, "fp32"
    )


@pytest.mark.gpu
def test_conv_sanitize(monkeypatch):
    """A small representative set for compute-sanitizer (memcheck, racecheck)."""
    monkeypatch.setenv(at.AUTOTUNE_ENV, "0")
    for case in (
        (3, 5, 6, (7, 6), (3, 2), (2, 1), (1, 1), 1),
        (2, 8, 8, (6, 6), (1, 1), (1, 1), (0, 0), 4),
        (1, 3, 4, (12, 12), (5, 5), (4, 4), (0, 2), 1),
    ):
        _check_every_algorithm(case, ("fp32",), f"sanitize {case}", monkeypatch)
