"""The net table of cc2ops.testing: shapes, parameter names, the training step.

The layer shapes are checked against a walk written here with the
:mod:`cc2ops.shapes` rules and against the sizes cuda-convnet's cfg files
state; the parameter names, shapes and spec hashes are pinned, because the
example's checkpoints are keyed by them (a change would orphan saved runs).
The step builds on the CPU and learns; its GPU-typed variant builds with no
device (the GPU mode's rewrites of it are ``tests/cuda/rewriting/test_gpu_step.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import cc2ops
from cc2ops.shapes import conv_output_length, pool_output_length
from cc2ops.testing import nets
from cc2ops.testing.nets import (
    FC,
    NET_INPUTS,
    NETS,
    Conv,
    Dropout,
    Network,
    NetworkError,
    Pool,
    RNorm,
    StepConfig,
    build_step,
    training_step,
)

#: Tiny bindings of each net: (classes, crop, width_mult).
TINY = {"imagenet": (3, 67, 1 / 16), "small": (3, 32, 0.25), "cifar18": (3, 32, 0.25)}


def walk(net: Network) -> list[tuple[int, ...]]:
    """Output shape of every layer, by the cc2ops.shapes rules (independent of
    Network._walk)."""
    c, h, w = 3, net.crop, net.crop
    n = None
    out = []
    for layer in net.layers:
        if isinstance(layer, Conv):
            h = conv_output_length(h, layer.size, layer.stride, layer.pad)
            w = conv_output_length(w, layer.size, layer.stride, layer.pad)
            c = layer.filters
        elif isinstance(layer, Pool):
            h = pool_output_length(h, layer.size, layer.stride, 0)
            w = pool_output_length(w, layer.size, layer.stride, 0)
        elif isinstance(layer, FC):
            n = layer.units
        out.append((c, h, w) if n is None else (n,))
    return out


@pytest.mark.parametrize("name", sorted(NETS))
def test_layer_shapes_follow_the_shape_rules(name):
    crop, classes = NET_INPUTS[name]
    net = Network(name, classes, crop)
    assert net.output_shapes == walk(net)
    assert net.input_shapes[0] == (3, crop, crop)
    assert net.input_shapes[1:] == net.output_shapes[:-1]
    assert net.output_shapes[-1] == (classes,)


def test_imagenet_sizes_are_the_cfg_ones():
    net = Network("imagenet", 1000, 224)
    got = dict(zip((l.name for l in net.layers), net.output_shapes, strict=True))
    assert got["conv1"] == (64, 54, 54)  # 11x11/4 of 224, no padding
    assert got["pool1"] == (64, 27, 27)
    assert got["pool2"] == (192, 13, 13)
    assert got["pool3"] == (256, 6, 6)
    assert got["fc4096a"] == (4096,) and got["fc1000"] == (1000,)
    assert net.input_shape("rnorm2") == (192, 27, 27)
    assert [type(l).__name__ for l in net.layers[:3]] == ["Conv", "RNorm", "Pool"]
    # cfg: conv1 has no neuron, pool1 does (ReLU after norm and pool)
    assert not net.layer("conv1").relu and net.layer("pool1").relu
    assert [l.p for l in net.dropout_layers()] == [0.5, 0.5]


def test_cifar18_is_the_18pct_layout():
    net = Network("cifar18", 10, 32)
    kinds = [
        (type(l).__name__, getattr(l, "kind", None), getattr(l, "relu", None))
        for l in net.layers
    ]
    assert kinds == [
        ("Conv", None, False),
        ("Pool", "max", True),
        ("RNorm", None, None),
        ("Conv", None, True),
        ("Pool", "avg", False),
        ("RNorm", None, None),
        ("Conv", None, True),
        ("Pool", "avg", False),
        ("FC", None, False),
    ]
    assert net.output_shapes[7] == (64, 4, 4)  # pool3: 1024 inputs to fc10
    assert net.param_shapes["fc10.W"] == (1024, 10)
    assert all(l.size == 3 and l.k == 1.0 for l in net.layers if isinstance(l, RNorm))
    assert not net.has_dropout


#: Pinned: the example's checkpoints hold these names, shapes and hashes.
PARAMS = {
    "imagenet": {
        "conv1.W": (64, 3, 11, 11), "conv1.b": (64,),
        "conv2.W": (192, 64, 5, 5), "conv2.b": (192,),
        "conv3.W": (384, 192, 3, 3), "conv3.b": (384,),
        "conv4.W": (256, 384, 3, 3), "conv4.b": (256,),
        "conv5.W": (256, 256, 3, 3), "conv5.b": (256,),
        "fc4096a.W": (9216, 4096), "fc4096a.b": (4096,),
        "fc4096b.W": (4096, 4096), "fc4096b.b": (4096,),
        "fc1000.W": (4096, 1000), "fc1000.b": (1000,),
    },
    "small": {
        "conv1.W": (64, 3, 5, 5), "conv1.b": (64,),
        "conv2.W": (64, 64, 5, 5), "conv2.b": (64,),
        "local3.W": (64, 64, 3, 3), "local3.b": (64,),
        "local4.W": (32, 64, 3, 3), "local4.b": (32,),
        "fc10.W": (2048, 10), "fc10.b": (10,),
    },
    "cifar18": {
        "conv1.W": (32, 3, 5, 5), "conv1.b": (32,),
        "conv2.W": (32, 32, 5, 5), "conv2.b": (32,),
        "conv3.W": (64, 32, 5, 5), "conv3.b": (64,),
        "fc10.W": (1024, 10), "fc10.b": (10,),
    },
}  # fmt: skip
HASHES = {
    ("imagenet", 1000, 224, 1.0): "ff19b8d0ee3b765a",
    ("small", 10, 32, 1.0): "4a08192a4abc5dda",
    ("imagenet", 4, 67, 0.02): "17c27d52cf6ee313",
    ("small", 3, 32, 0.25): "60b49611a5251399",
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_parameter_names_and_shapes_are_stable(name):
    crop, classes = NET_INPUTS[name]
    net = Network(name, classes, crop)
    assert list(net.param_shapes.items()) == list(PARAMS[name].items())
    values = net.init_params(0)
    assert list(values) == list(PARAMS[name])
    for k, v in values.items():
        assert v.shape == PARAMS[name][k] and v.dtype == np.float32, k


@pytest.mark.parametrize("args, want", sorted(HASHES.items()))
def test_spec_hashes_of_saved_runs_are_unchanged(args, want):
    assert Network(*args).spec_hash() == want


def test_init_is_reproducible_and_cc2_uses_the_cfg_values():
    net = Network("imagenet", 10, 67, 1 / 16)
    a, b = net.init_params([0, 1]), net.init_params([0, 1])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    cc2 = net.init_params(0, "cc2")
    assert np.all(cc2["fc1000.b"] == -7.0) and np.all(cc2["conv2.b"] == 1.0)
    assert np.all(a["conv2.b"] == 0.0)


def test_bad_networks_name_the_problem():
    with pytest.raises(NetworkError, match="unknown network 'alexnet'"):
        Network("alexnet", 10, 32)
    too_small = r"40x40 inputs: layer pool3 gets \(4, 2, 2\)"
    with pytest.raises(NetworkError, match=too_small):
        Network("imagenet", 10, 40, 1 / 64)
    with pytest.raises(NetworkError, match="--width-mult must be > 0"):
        Network("small", 10, 32, 0)
    with pytest.raises(NetworkError, match=">= 2 classes"):
        Network("small", 1, 32)
    with pytest.raises(NetworkError, match="--init must be one of"):
        Network("small", 10, 32).init_params(0, "glorot")
    with pytest.raises(NetworkError, match="unknown network 'vgg'"):
        StepConfig("vgg")


def test_a_subclass_offers_its_own_nets_and_error():
    class Mine(ValueError):
        pass

    class Only(Network):
        nets = {"cifar18": nets.cifar18_layers}
        error = Mine

    assert Only("cifar18", 10, 32).spec_hash() == Network("cifar18", 10, 32).spec_hash()
    with pytest.raises(Mine, match=r"choose from \['cifar18'\]"):
        Only("small", 10, 32)


def test_step_config_defaults_to_the_cfg_input():
    cfg = StepConfig("cifar18", batch=128)
    assert (cfg.crop, cfg.classes, cfg.name) == (32, 10, "cifar18_step_b128")
    assert cfg.image_shape == (128, 3, 32, 32)
    assert StepConfig().network().spec_hash() == HASHES[("imagenet", 1000, 224, 1.0)]


def tiny(name: str, **kw) -> StepConfig:
    classes, crop, width = TINY[name]
    return StepConfig(name, batch=6, crop=crop, classes=classes, width_mult=width, **kw)


def batch(cfg: StepConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    x = r.standard_normal(cfg.image_shape).astype(np.float32)
    return x, r.integers(0, cfg.classes, cfg.batch).astype(np.int32)


@pytest.mark.parametrize("name", sorted(NETS))
def test_one_cpu_step_lowers_the_loss(name):
    cfg = tiny(name, lr=0.003, dropout=False)
    step = build_step(cfg)
    assert [v.name for v in step.inputs] == ["images", "labels"]
    assert list(step.velocities) == list(step.params)
    assert all(v.name == f"{k}.momentum" for k, v in step.velocities.items())
    fn = step.function(cc2ops.mode)
    x, y = batch(cfg)
    losses = []
    for _ in range(3):
        loss, err = fn(x, y)
        assert 0.0 <= float(err) <= 1.0
        losses.append(float(loss))
    assert np.isfinite(losses).all(), losses
    assert losses[1] < losses[0] and losses[2] < losses[0], losses


def test_a_dropout_step_advances_one_state_per_layer():
    cfg = tiny("imagenet")
    step = build_step(cfg)
    assert len(step.dropout_states) == 2
    fn = step.function(cc2ops.mode)
    before = [s.get_value().copy() for s in step.dropout_states]
    loss, _ = fn(*batch(cfg))
    assert np.isfinite(loss)
    after = [s.get_value() for s in step.dropout_states]
    assert all(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))


def test_the_update_rule_decays_weights_only():
    """One step from zero velocity: p <- p - lr (g + wd W), biases undecayed."""
    import pytensor
    import pytensor.tensor as pt

    cfg = tiny("cifar18", lr=0.1, weight_decay=0.5)
    net = cfg.network()
    values = cfg.init_params()
    params = {k: pytensor.shared(v.copy(), name=k) for k, v in values.items()}
    vel = {k: pytensor.shared(np.zeros_like(v), name=k) for k, v in values.items()}
    x = pt.tensor("x", dtype="float32", shape=cfg.image_shape)
    y = pt.ivector("y")
    g = training_step(net, x, y, params, vel, lr=np.float32(cfg.lr), momentum=0.9,
                      weight_decay=cfg.weight_decay)  # fmt: skip
    grads = pytensor.grad(g.loss, list(params.values()))
    grad_fn = pytensor.function([x, y], grads, mode=cc2ops.mode)
    step_fn = pytensor.function([x, y], g.loss, updates=g.updates, mode=cc2ops.mode)
    r = np.random.default_rng(1)
    xv = r.standard_normal(cfg.image_shape).astype(np.float32)
    yv = r.integers(0, cfg.classes, cfg.batch).astype(np.int32)
    want_grads = dict(zip(params, grad_fn(xv, yv), strict=True))
    step_fn(xv, yv)
    for k, p in params.items():
        decay = cfg.weight_decay * values[k] if k.endswith(".W") else 0.0
        want = values[k] - cfg.lr * (want_grads[k] + decay)
        np.testing.assert_allclose(p.get_value(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            vel[k].get_value(), want - values[k], rtol=1e-5, atol=1e-7
        )


def test_training_step_distributes_before_the_gradients():
    seen = []

    def distribute(outs):
        seen.append(len(outs))
        return [2.0 * o for o in outs]

    step = build_step(tiny("small"), distribute=distribute, error=False)
    assert seen == [1] and len(step.outputs) == 1


def test_dropout_off_skips_the_dropout_layers():
    step = build_step(tiny("imagenet", dropout=False))
    assert step.dropout_states == []
    fn = step.function(cc2ops.mode)
    ops = {type(n.op).__name__ for n in fn.maker.fgraph.apply_nodes}
    assert not any("Dropout" in o for o in ops), ops


def test_gpu_typed_step_builds_without_a_device(monkeypatch):
    """GPU parameters, states, inputs and outputs through the seam; no CUDA call."""
    import cc2ops.cuda.runtime.array as garray
    from cc2ops.cuda.type import CudaArrayType, CudaSharedVariable

    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA was touched while building the step")

    for fn in ("to_gpu", "empty", "copy"):
        monkeypatch.setattr(garray, fn, forbidden)
    step = build_step(
        tiny("imagenet"), gpu_params=True, device=1, gpu_inputs=True, gpu_outputs=True
    )
    shared = [*step.params.values(), *step.velocities.values(), *step.dropout_states]
    assert len(step.dropout_states) == 2
    for v in shared:
        assert isinstance(v, CudaSharedVariable) and not v.is_uploaded, v.name
        assert v.type.device == 1, v.name
    for v in [*step.inputs, *step.outputs]:
        assert isinstance(v.type, CudaArrayType) and v.type.device == 1, v
    assert step.inputs[0].type.shape == (6, 3, 67, 67)
    assert [v.type.ndim for v in step.outputs] == [0, 0]


def test_layer_records_are_plain_data():
    assert Conv("c", 8, 3) == Conv("c", 8, 3)
    assert FC("f", None).units is None and Dropout("d").p == 0.5
    assert Pool("p").kind == "max" and RNorm("r").size == 5
