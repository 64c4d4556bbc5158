"""The cuda-convnet2 ImageNet training step built from cc2ops's public ops.

One builder serves the whole-step benchmark (``benchmarks/bench_step.py``),
the GPU step test (``tests/cuda/test_step.py``) and the CPU graph check
(``tests/graph/test_gpu_step.py``)::

    cfg = imagenet_config(batch=128)
    params = init_params(cfg, seed=0)          # numpy, also used for torch
    step = build_step(cfg, params, gpu_params=True)
    fn = pytensor.function(step.inputs, step.outputs, updates=step.updates,
                           mode=cc2ops.cuda.mode())
    loss, err = fn(images, labels)

The net (images (B, C, H, W), "bc01"):

conv1 C->64 11x11/4 pad 0, ReLU, cross_map_norm(5), max_pool2d(3, 2);
conv2 64->192 5x5 pad 2, ReLU, cross_map_norm(5), max_pool2d(3, 2);
conv3 192->384, conv4 384->256, conv5 256->256 (3x3 pad 1, ReLU); max_pool2d(3, 2);
FC 4096 ReLU dropout(0.5), FC 4096 ReLU dropout(0.5), FC classes;
cost ``softmax_cross_entropy(logits, labels).mean()``, and
``top_k_error(logits, labels, 1).mean()`` reported.

Updates are momentum SGD with weight decay, PyTorch's ``torch.optim.SGD``
rule (``dampening=0``, ``nesterov=False``), for every parameter::

    v <- momentum * v + (grad + weight_decay * p)
    p <- p - lr * v

Velocities start at zero, which makes the first step ``v = grad + wd * p``,
as in PyTorch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt

import cc2ops
from cc2ops.shapes import conv_output_length, pool_output_length

__all__ = [
    "ConvLayer",
    "NetConfig",
    "Step",
    "imagenet_config",
    "small_config",
    "init_params",
    "param_names",
    "build_step",
    "feature_shape",
    "dropout_state_on_gpu",
]


@dataclass(frozen=True)
class ConvLayer:
    """One convolution layer: conv, ReLU, then optional norm and pool.

    Parameters
    ----------
    filters, size, stride, padding : int
        Output channels, square filter size, stride and zero padding.
    norm : bool
        ``cross_map_norm(size=5)`` after the ReLU.
    pool : bool
        ``max_pool2d(3, 2)`` after the (norm and) ReLU.
    """

    filters: int
    size: int
    stride: int = 1
    padding: int = 0
    norm: bool = False
    pool: bool = False


@dataclass(frozen=True)
class NetConfig:
    """Geometry and optimiser settings of a step.

    Parameters
    ----------
    image : int
        Square input size (H = W).
    channels : int
        Input channels.
    conv : tuple of ConvLayer
    fc : tuple of int
        Hidden fully connected widths (ReLU and dropout after each).
    classes : int
    batch : int
    dropout : float
        Drop probability after each hidden FC layer; 0 disables dropout.
    lr, momentum, weight_decay : float
    norm_size, norm_alpha, norm_beta, norm_k
        ``cross_map_norm`` settings (PyTorch ``LocalResponseNorm`` meaning).
    dtype : str
    """

    image: int = 224
    channels: int = 3
    conv: tuple[ConvLayer, ...] = ()
    fc: tuple[int, ...] = (4096, 4096)
    classes: int = 1000
    batch: int = 128
    dropout: float = 0.5
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    norm_size: int = 5
    norm_alpha: float = 1e-4
    norm_beta: float = 0.75
    norm_k: float = 2.0
    dtype: str = "float32"

    def with_(self, **changes: Any) -> NetConfig:
        """A copy with some fields replaced."""
        return replace(self, **changes)


def imagenet_config(
    *,
    batch: int = 128,
    image: int = 224,
    widths: Sequence[int] = (64, 192, 384, 256, 256),
    fc: Sequence[int] = (4096, 4096),
    classes: int = 1000,
    dropout: float = 0.5,
) -> NetConfig:
    """The cuda-convnet2 one-tower ImageNet net ("AlexNet" layout).

    ``widths`` are the five conv layers' filter counts.
    """
    if len(widths) != 5:
        raise ValueError(f"imagenet_config: widths must have 5 entries, got {widths}")
    w1, w2, w3, w4, w5 = (int(w) for w in widths)
    conv = (
        ConvLayer(w1, 11, stride=4, padding=0, norm=True, pool=True),
        ConvLayer(w2, 5, padding=2, norm=True, pool=True),
        ConvLayer(w3, 3, padding=1),
        ConvLayer(w4, 3, padding=1),
        ConvLayer(w5, 3, padding=1, pool=True),
    )
    return NetConfig(
        image=image,
        conv=conv,
        fc=tuple(int(f) for f in fc),
        classes=classes,
        batch=batch,
        dropout=dropout,
    )


def small_config(
    *,
    batch: int = 16,
    image: int = 32,
    widths: Sequence[int] = (16, 32),
    fc: Sequence[int] = (64,),
    classes: int = 10,
    dropout: float = 0.0,
) -> NetConfig:
    """A two-conv-layer net on small images (the 20-step GPU-vs-CPU test)."""
    w1, w2 = (int(w) for w in widths)
    conv = (
        ConvLayer(w1, 5, stride=1, padding=2, norm=True, pool=True),
        ConvLayer(w2, 3, padding=1, norm=True, pool=True),
    )
    return NetConfig(
        image=image,
        conv=conv,
        fc=tuple(int(f) for f in fc),
        classes=classes,
        batch=batch,
        dropout=dropout,
        lr=0.01,
    )


def feature_shape(cfg: NetConfig) -> tuple[int, int, int]:
    """(C, H, W) of the last conv block's output (cc2ops.shapes rules)."""
    c, h = cfg.channels, cfg.image
    for layer in cfg.conv:
        h = conv_output_length(h, layer.size, layer.stride, layer.padding)
        c = layer.filters
        if layer.pool:
            h = pool_output_length(h, 3, 2, 0)
    return c, h, h


def param_names(cfg: NetConfig) -> list[str]:
    """Parameter names in a fixed order: conv<i>_w, conv<i>_b, ..., fc<j>_w, fc<j>_b."""
    names = []
    for i in range(len(cfg.conv)):
        names += [f"conv{i + 1}_w", f"conv{i + 1}_b"]
    for j in range(len(cfg.fc) + 1):
        names += [f"fc{j + 1}_w", f"fc{j + 1}_b"]
    return names


def init_params(cfg: NetConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """He-normal weights, small positive biases (numpy, ``cfg.dtype``).

    Conv weights are (F, C, kh, kw); FC weights are (in, out) (PyTorch's
    ``Linear.weight`` is the transpose).
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    c = cfg.channels
    for i, layer in enumerate(cfg.conv):
        fan_in = c * layer.size * layer.size
        w = rng.normal(
            0.0, np.sqrt(2.0 / fan_in), (layer.filters, c, layer.size, layer.size)
        )
        out[f"conv{i + 1}_w"] = w.astype(cfg.dtype)
        out[f"conv{i + 1}_b"] = np.full(layer.filters, 0.01, cfg.dtype)
        c = layer.filters
    fc, h, w_ = feature_shape(cfg)
    width = fc * h * w_
    sizes = [*cfg.fc, cfg.classes]
    for j, n in enumerate(sizes):
        scale = np.sqrt(2.0 / width) if j < len(cfg.fc) else np.sqrt(1.0 / width)
        out[f"fc{j + 1}_w"] = rng.normal(0.0, scale, (width, n)).astype(cfg.dtype)
        out[f"fc{j + 1}_b"] = np.full(n, 0.01 if j < len(cfg.fc) else 0.0, cfg.dtype)
        width = n
    return out


@dataclass
class Step:
    """A built training step: what ``pytensor.function`` takes.

    Attributes
    ----------
    inputs : list
        ``[images (B, C, H, W), labels (B,) int32]`` (host tensors, or GPU
        variables with ``gpu_inputs``).
    outputs : list
        ``[loss, top-1 error]`` scalars (batch means; GPU scalars with
        ``gpu_outputs``).
    updates : list of (shared, expression)
        Parameter and velocity updates.
    params, velocities : dict of name -> shared variable
    logits : variable
        (B, classes), for inspection.
    config : NetConfig
    dropout_states : list of shared variables
        One ``cc2ops.dropout_state`` per dropout layer (their counter
        advances are default updates, which ``pytensor.function`` adds); GPU
        shared variables with ``gpu_params`` where supported.
    """

    inputs: list
    outputs: list
    updates: list
    params: dict[str, Any]
    velocities: dict[str, Any]
    logits: Any
    config: NetConfig
    dropout_states: list = field(default_factory=list)

    def function(self, mode: Any, **kwargs: Any) -> Any:
        """``pytensor.function(inputs, outputs, updates=updates, mode=mode)``."""
        return pytensor.function(
            self.inputs, self.outputs, updates=self.updates, mode=mode, **kwargs
        )


def _shared(value: np.ndarray, name: str, gpu: bool, device: int) -> Any:
    if gpu:
        from cc2ops.cuda import shared

        return shared(value, device=device, name=name, shape=value.shape)
    return pytensor.shared(value, name=name, shape=value.shape)


def dropout_state_on_gpu() -> bool:
    """Whether ``cc2ops.dropout_state`` can make a GPU state (``device=``)."""
    fn = getattr(cc2ops, "dropout_state", None)
    if fn is None:
        return False
    return "device" in inspect.signature(fn).parameters


def _dropout_state(seed: int, name: str, device: int | None) -> Any:
    """A dropout state; on GPU ``device`` when given and supported.

    A GPU state keeps the whole step on the device: the mask kernel reads the
    counter from device memory and its advance is a GPU op.
    """
    if device is not None and dropout_state_on_gpu():
        return cc2ops.dropout_state(seed, name=name, device=device)
    return cc2ops.dropout_state(seed, name=name)


def build_step(
    cfg: NetConfig,
    params: dict[str, np.ndarray] | None = None,
    *,
    gpu_params: bool = False,
    device: int = 0,
    dropout: bool | None = None,
    dropout_seed: int = 1234,
    static_batch: bool = True,
    gpu_inputs: bool = False,
    gpu_outputs: bool = False,
) -> Step:
    """Build the training step graph of ``cfg``.

    Parameters
    ----------
    cfg : NetConfig
    params : dict of name -> ndarray, optional
        Initial values (default ``init_params(cfg)``); copied into shared
        variables.
    gpu_params : bool
        Parameters and velocities as ``cc2ops.cuda.shared`` (they live on
        GPU ``device``; creating them never touches CUDA) instead of host
        ``pytensor.shared``.
    dropout : bool, optional
        Default ``cfg.dropout > 0``. Uses ``cc2ops.dropout``; layer ``j`` gets
        the state ``cc2ops.dropout_state(dropout_seed + j)``, on GPU ``device``
        with ``gpu_params`` (when ``dropout_state`` takes ``device=``; see
        :func:`dropout_state_on_gpu`). The masks are the same either way.
    static_batch : bool
        Give the image and label inputs the static batch size ``cfg.batch``.
    gpu_inputs : bool
        Images and labels as GPU variables (``CudaArrayType`` on ``device``;
        the caller passes GPUArrays, no per-step upload).
    gpu_outputs : bool
        Return loss and error as GPU scalars (no per-step download, so a
        step never waits for the device).

    Returns
    -------
    Step
    """
    if params is None:
        params = init_params(cfg)
    use_dropout = (cfg.dropout > 0) if dropout is None else bool(dropout)
    states: list[Any] = []
    if use_dropout and not hasattr(cc2ops, "dropout_state"):
        raise RuntimeError(
            "build_step: dropout needs cc2ops.dropout / cc2ops.dropout_state, "
            "which this cc2ops lacks; pass dropout=False"
        )
    b = cfg.batch if static_batch else None
    image_shape = (b, cfg.channels, cfg.image, cfg.image)
    if gpu_inputs:
        from cc2ops.cuda import CudaArrayType, host_from_gpu

        x_in = CudaArrayType(cfg.dtype, image_shape, device)("images")
        y_in = CudaArrayType("int32", (b,), device)("labels")
        x, y = host_from_gpu(x_in), host_from_gpu(y_in)
    else:
        x = x_in = pt.tensor("images", dtype=cfg.dtype, shape=image_shape)
        y = y_in = pt.tensor("labels", dtype="int32", shape=(b,))
    shared = {
        name: _shared(np.asarray(params[name], cfg.dtype), name, gpu_params, device)
        for name in param_names(cfg)
    }

    h = x
    for i, layer in enumerate(cfg.conv):
        w, bias = shared[f"conv{i + 1}_w"], shared[f"conv{i + 1}_b"]
        h = cc2ops.conv2d(h, w, stride=layer.stride, padding=layer.padding)
        h = pt.maximum(h + bias.dimshuffle("x", 0, "x", "x"), 0)
        if layer.norm:
            h = cc2ops.cross_map_norm(
                h,
                size=cfg.norm_size,
                alpha=cfg.norm_alpha,
                beta=cfg.norm_beta,
                k=cfg.norm_k,
            )
        if layer.pool:
            h = cc2ops.max_pool2d(h, 3, 2)
    h = h.flatten(2)
    for j in range(len(cfg.fc)):
        w, bias = shared[f"fc{j + 1}_w"], shared[f"fc{j + 1}_b"]
        h = pt.maximum(pt.dot(h, w) + bias, 0)
        if use_dropout:
            # one state per dropout call (each state's default update is its
            # own counter advance)
            state = _dropout_state(
                dropout_seed + j, f"dropout{j + 1}", device if gpu_params else None
            )
            states.append(state)
            h = cc2ops.dropout(h, cfg.dropout, state)
    j = len(cfg.fc)
    logits = pt.dot(h, shared[f"fc{j + 1}_w"]) + shared[f"fc{j + 1}_b"]
    loss = cc2ops.softmax_cross_entropy(logits, y).mean()
    err = cc2ops.top_k_error(logits, y, 1).mean()

    names = list(shared)
    grads = pytensor.grad(loss, [shared[n] for n in names])
    velocities = {
        n: _shared(
            np.zeros_like(params[n], dtype=cfg.dtype), f"v_{n}", gpu_params, device
        )
        for n in names
    }
    lr = np.asarray(cfg.lr, cfg.dtype)
    mom = np.asarray(cfg.momentum, cfg.dtype)
    wd = np.asarray(cfg.weight_decay, cfg.dtype)
    updates = []
    for n, g in zip(names, grads, strict=True):
        p, v = shared[n], velocities[n]
        v_new = mom * v + (g + wd * p)
        updates.append((v, v_new))
        updates.append((p, p - lr * v_new))
    outputs = [loss, err]
    if gpu_outputs:
        from cc2ops.cuda import gpu_from_host

        outputs = [gpu_from_host(v, device) for v in outputs]
    return Step(
        inputs=[x_in, y_in],
        outputs=outputs,
        updates=updates,
        params=shared,
        velocities=velocities,
        logits=logits,
        config=cfg,
        dropout_states=states,
    )
