"""The cuda-convnet2 nets as data, their graphs, and the momentum-SGD training step.

One definition of each net serves ``examples/imagenet`` (which trains it),
``benchmarks/`` (which time its step and its layers) and ``tests/`` (which
check its step on both devices).

A net is a tuple of layer records (:class:`Conv`, :class:`Pool`,
:class:`RNorm`, :class:`FC`, :class:`Dropout`) in the order of its cuda-convnet
layer file. :class:`Network` binds a tuple to an input size, a number of
classes and a width multiplier, walks it once with the shape rules of
:mod:`cc2ops.shapes` (an input too small is reported before anything is
compiled), names and shapes the parameters, draws initial values and builds
the graph with the public ops: ``cc2ops.conv2d``, ``cc2ops.max_pool2d`` /
``cc2ops.avg_pool2d``, ``cc2ops.cross_map_norm``, ``cc2ops.dropout``,
``pt.dot`` for fully connected layers and ``pt.maximum(x, 0)`` for ReLU.
Everything is float32 in bc01 order, images (B, C, H, W).

The nets
--------
``imagenet``
    cuda-convnet2's ``layers-imagenet-1gpu.cfg`` for 224 x 224 inputs
    (conv1 64 11x11/4 -> 54 x 54, ..., fc4096, dropout, fc4096, dropout,
    fc<classes>). Its ReLUs sit where the cfg puts ``neuron=relu``: conv1's
    output is normalised and pooled before the ReLU (``pool1``), conv5's
    after ``pool3``. The cfg file says ``outputs=8192`` for ``fc4096b``,
    at odds with the layer's name and with the 4-GPU cfg (4096); this uses
    4096. cuda-convnet2's ``dropout2`` scales by the keep rate at test time;
    this uses the equivalent inverted dropout (scale by 1/keep while
    training, nothing at test time).
``small``
    cuda-convnet2's CIFAR-10 "11pct" layout (``layers-cifar10-11pct.cfg``)
    for 32 x 32 inputs: conv1 64 5x5, max-pool 3/2, cmrnorm 9, conv2 64 5x5,
    cmrnorm 9, max-pool 3/2, local3 64 3x3, local4 32 3x3, fc<classes>. The
    cfg's ``local3``/``local4`` are locally connected (unshared weights);
    cc2ops has no locally connected op, so they are 3x3 convolutions here.
    Normalisation parameters as in ``layer-params-cifar10-11pct.cfg``
    (scale 0.001, pow 0.75, cuda-convnet's default minDiv 1).
``cifar18``
    cuda-convnet's (the first one's) CIFAR-10 "18pct" layout
    (``example-layers/layers-18pct.cfg``) for 32 x 32 inputs: conv1 32 5x5
    pad 2, max-pool 3/2 with the ReLU after it (``pool1`` has
    ``neuron=relu``), rnorm1; conv2 32 5x5 pad 2 + ReLU, avg-pool 3/2,
    rnorm2; conv3 64 5x5 pad 2 + ReLU, avg-pool 3/2 (64 x 4 x 4); fc10,
    softmax. Initial standard deviations as in the cfg (``initW`` 1e-4 for
    conv1, 0.01 for the others; zero biases); normalisation ``size=3``,
    ``scale=0.00005``, ``pow=0.75`` as in ``layer-params-18pct.cfg``, minDiv 1.
    That file's ``rnorm`` is cuda-convnet's *same-map* normalisation (a 3 x 3
    spatial window in each channel); cc2ops has only the cross-map one, so
    rnorm1/rnorm2 are ``cross_map_norm(size=3)`` here (over 3 neighbouring
    channels, the sum scaled by ``alpha / size`` as cuda-convnet scales by its
    window's element count). The file's per-layer learning rates and weight
    costs (``epsW``, ``epsB``, ``wc``: 0.004 for the convs, 1 for fc10) are
    not part of the table: the step uses one rate and one weight decay.

Initialisation: ``"he"`` (default) draws N(0, 2/fan_in) weights (1/fan_in
for the classifier) and zero biases; ``"cc2"`` uses the cfg files'
per-layer ``initW`` standard deviations and ``initB`` biases.

The training step
-----------------
:func:`training_step` is the step of every user of this module: the net's
logits, ``softmax_cross_entropy(logits, labels).mean()`` as the cost,
``top_k_error(logits, labels, 1).mean()`` reported, and momentum SGD with
weight decay on the weights (not the biases)::

    g <- grad + weight_decay * W          (weights only)
    v <- momentum * v - lr * g
    p <- p + v

With a constant learning rate this is PyTorch's ``torch.optim.SGD`` rule
(velocity ``-v / lr``) with ``weight_decay`` on the weights' parameter group.
:func:`build_step` makes the inputs, the shared variables (host, or GPU
through :mod:`cc2ops.seam`) and the dropout states around it for a
:class:`StepConfig`; the example builds its own (checkpointed) ones and calls
:func:`training_step` directly. Precision (TF32, bf16) is a property of the
mode a step is compiled in, not of the graph.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import pytensor
import pytensor.tensor as pt

import cc2ops
from cc2ops import seam, shapes

__all__ = [
    "Conv",
    "Pool",
    "RNorm",
    "FC",
    "Dropout",
    "Layer",
    "INITS",
    "NetworkError",
    "imagenet_layers",
    "small_layers",
    "cifar18_layers",
    "NETS",
    "NET_INPUTS",
    "Network",
    "StepGraph",
    "training_step",
    "StepConfig",
    "Step",
    "build_step",
]

INITS = ("he", "cc2")


class NetworkError(ValueError):
    """A network that cannot be built as asked (unknown name, input too small)."""


@dataclass(frozen=True)
class Conv:
    """Convolution + bias (+ ReLU). Weights (filters, C/groups, size, size)."""

    name: str
    filters: int
    size: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    relu: bool = True
    init_std: float = 0.01
    init_bias: float = 0.0


@dataclass(frozen=True)
class Pool:
    """Max or average pooling (cuda-convnet2's window rule) (+ ReLU)."""

    name: str
    kind: str = "max"
    size: int = 3
    stride: int = 2
    relu: bool = False


@dataclass(frozen=True)
class RNorm:
    """Cross-map response normalisation (cuda-convnet2's ``cmrnorm``)."""

    name: str
    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 2.0


@dataclass(frozen=True)
class FC:
    """Fully connected layer (+ ReLU); ``units=None`` means one per class."""

    name: str
    units: int | None
    relu: bool = True
    init_std: float = 0.01
    init_bias: float = 0.0


@dataclass(frozen=True)
class Dropout:
    """Inverted dropout of probability ``p``, active only in training graphs."""

    name: str
    p: float = 0.5


Layer = Conv | Pool | RNorm | FC | Dropout


def imagenet_layers() -> tuple[Layer, ...]:
    """cuda-convnet2's ``layers-imagenet-1gpu`` (see the module docstring)."""
    return (
        Conv("conv1", 64, 11, stride=4, pad=0, relu=False, init_std=0.01),
        RNorm("rnorm1", size=5, alpha=1e-4, beta=0.75, k=2.0),
        Pool("pool1", "max", 3, 2, relu=True),
        Conv("conv2", 192, 5, pad=2, init_std=0.01, init_bias=1.0),
        RNorm("rnorm2", size=5, alpha=1e-4, beta=0.75, k=2.0),
        Pool("pool2", "max", 3, 2),
        Conv("conv3", 384, 3, pad=1, init_std=0.03),
        Conv("conv4", 256, 3, pad=1, init_std=0.03, init_bias=1.0),
        Conv("conv5", 256, 3, pad=1, relu=False, init_std=0.03, init_bias=1.0),
        Pool("pool3", "max", 3, 2, relu=True),
        FC("fc4096a", 4096, init_std=0.01, init_bias=1.0),
        Dropout("dropout1", 0.5),
        FC("fc4096b", 4096, init_std=0.01, init_bias=1.0),
        Dropout("dropout2", 0.5),
        FC("fc1000", None, relu=False, init_std=0.01, init_bias=-7.0),
    )


def small_layers() -> tuple[Layer, ...]:
    """cuda-convnet2's CIFAR-10 ``11pct`` layout (see the module docstring)."""
    return (
        Conv("conv1", 64, 5, pad=2, init_std=1e-4),
        Pool("pool1", "max", 3, 2),
        RNorm("rnorm1", size=9, alpha=1e-3, beta=0.75, k=1.0),
        Conv("conv2", 64, 5, pad=2, init_std=0.01),
        RNorm("rnorm2", size=9, alpha=1e-3, beta=0.75, k=1.0),
        Pool("pool2", "max", 3, 2),
        Conv("local3", 64, 3, pad=1, init_std=0.04),
        Conv("local4", 32, 3, pad=1, init_std=0.04),
        FC("fc10", None, relu=False, init_std=0.01),
    )


def cifar18_layers() -> tuple[Layer, ...]:
    """cuda-convnet's CIFAR-10 ``18pct`` layout (see the module docstring)."""
    return (
        Conv("conv1", 32, 5, pad=2, relu=False, init_std=1e-4),
        Pool("pool1", "max", 3, 2, relu=True),
        RNorm("rnorm1", size=3, alpha=5e-5, beta=0.75, k=1.0),
        Conv("conv2", 32, 5, pad=2, init_std=0.01),
        Pool("pool2", "avg", 3, 2),
        RNorm("rnorm2", size=3, alpha=5e-5, beta=0.75, k=1.0),
        Conv("conv3", 64, 5, pad=2, init_std=0.01),
        Pool("pool3", "avg", 3, 2),
        FC("fc10", None, relu=False, init_std=0.01),
    )


#: The nets by name: a function returning the layer tuple.
NETS: dict[str, Callable[[], tuple[Layer, ...]]] = {
    "imagenet": imagenet_layers,
    "small": small_layers,
    "cifar18": cifar18_layers,
}
#: Each net's input size (crop) and number of classes as in its cfg.
NET_INPUTS: dict[str, tuple[int, int]] = {
    "imagenet": (224, 1000),
    "small": (32, 10),
    "cifar18": (32, 10),
}


def _scaled(units: int, width_mult: float, groups: int = 1) -> int:
    # keep at least one unit per group and a multiple of the groups
    per_group = max(1, round(units * width_mult / groups))
    return per_group * groups


class Network:
    """A layer list bound to an input size and a number of classes.

    Parameters
    ----------
    name : str
        A key of :attr:`nets` ("imagenet", "small", "cifar18").
    n_classes : int
        Outputs of the last layer (its ``units=None``).
    crop : int
        Input images are (B, 3, crop, crop).
    width_mult : float
        Multiplies every layer's filter / unit count (not the classes); < 1
        gives the fast variants the tests use.

    Attributes
    ----------
    layers : tuple of Layer
        The bound layers (scaled widths, the classifier's units filled in).
    input_shapes, output_shapes : list of tuple
        (C, H, W) or (units,) entering and leaving each layer, one per layer.
    param_shapes : dict of str -> tuple
        ``"<layer>.W"`` / ``"<layer>.b"`` in layer order; conv weights
        (filters, C/groups, size, size), FC weights (in, out).
    nets : ClassVar mapping
        The names a subclass accepts (default :data:`NETS`).
    error : ClassVar exception type
        What is raised for a network that cannot be built (default
        :class:`NetworkError`; a subclass may raise its own).

    Raises
    ------
    NetworkError
        Unknown name, ``width_mult <= 0``, fewer than 2 classes, or an input
        too small for some layer (the message names the layer and the rule).
    """

    nets: ClassVar[Mapping[str, Callable[[], tuple[Layer, ...]]]] = NETS
    error: ClassVar[type[Exception]] = NetworkError

    def __init__(
        self, name: str, n_classes: int, crop: int, width_mult: float = 1.0
    ) -> None:
        if name not in self.nets:
            raise self.error(
                f"unknown network {name!r}; choose from {sorted(self.nets)}"
            )
        if not width_mult > 0:
            raise self.error(f"--width-mult must be > 0, got {width_mult}")
        if n_classes < 2:
            raise self.error(f"a classifier needs >= 2 classes, got {n_classes}")
        self.name = name
        self.n_classes = int(n_classes)
        self.crop = int(crop)
        self.width_mult = float(width_mult)
        layers = []
        for layer in self.nets[name]():
            if isinstance(layer, Conv):
                layer = replace(
                    layer, filters=_scaled(layer.filters, width_mult, layer.groups)
                )
            elif isinstance(layer, FC):
                units = (
                    self.n_classes
                    if layer.units is None
                    else _scaled(layer.units, width_mult)
                )
                layer = replace(layer, units=units)
            layers.append(layer)
        self.layers: tuple[Layer, ...] = tuple(layers)
        self.input_shapes, self.output_shapes, self.param_shapes = self._walk()

    def _walk(
        self,
    ) -> tuple[
        list[tuple[int, ...]], list[tuple[int, ...]], dict[str, tuple[int, ...]]
    ]:
        shape: tuple[int, ...] = (3, self.crop, self.crop)
        in_shapes, out_shapes = [], []
        params: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            in_shapes.append(shape)
            try:
                shape = self._layer_shape(layer, shape, params)
            except ValueError as e:
                raise self.error(
                    f"network {self.name!r} does not fit {self.crop}x{self.crop} "
                    f"inputs: layer {layer.name} gets {shape}: {e}"
                ) from e
            out_shapes.append(shape)
        return in_shapes, out_shapes, params

    @staticmethod
    def _layer_shape(layer: Layer, shape, params) -> tuple[int, ...]:
        if isinstance(layer, Conv):
            c, h, w = shape
            if c % layer.groups:
                raise ValueError(f"groups ({layer.groups}) must divide channels ({c})")
            ho, wo = shapes.conv_output_shape(
                (h, w),
                (layer.size,) * 2,
                (layer.stride,) * 2,
                (layer.pad,) * 2,
                op=layer.name,
            )
            params[f"{layer.name}.W"] = (
                layer.filters,
                c // layer.groups,
                layer.size,
                layer.size,
            )
            params[f"{layer.name}.b"] = (layer.filters,)
            return (layer.filters, ho, wo)
        if isinstance(layer, Pool):
            c, h, w = shape
            ho, wo = shapes.pool_output_shape(
                (h, w), (layer.size,) * 2, (layer.stride,) * 2, (0, 0), op=layer.name
            )
            return (c, ho, wo)
        if isinstance(layer, FC):
            fan_in = int(np.prod(shape))
            params[f"{layer.name}.W"] = (fan_in, layer.units)
            params[f"{layer.name}.b"] = (layer.units,)
            return (layer.units,)
        return shape  # RNorm and Dropout keep the shape

    # ---------------------------------------------------------------- identity

    def spec(self) -> dict[str, Any]:
        """JSON-able description: name, input, classes, width and every layer."""
        return {
            "name": self.name,
            "input": [3, self.crop, self.crop],
            "n_classes": self.n_classes,
            "width_mult": self.width_mult,
            "layers": [{"type": type(l).__name__, **asdict(l)} for l in self.layers],
            "params": {k: list(v) for k, v in self.param_shapes.items()},
        }

    def spec_hash(self) -> str:
        """A short hash of :meth:`spec`; equal hashes: interchangeable parameters."""
        text = json.dumps(self.spec(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """A table of the layers, their output shapes and parameter counts."""
        lines = [
            f"network {self.name} ({self.spec_hash()}), input 3x{self.crop}x{self.crop}"
        ]
        for layer, shape in zip(self.layers, self.output_shapes, strict=True):
            n = sum(
                int(np.prod(s))
                for k, s in self.param_shapes.items()
                if k.split(".")[0] == layer.name
            )
            dims = "x".join(str(d) for d in shape)
            lines.append(
                f"  {layer.name:<9} {type(layer).__name__:<7} -> {dims:<12} "
                f"{n:>10,d} params"
            )
        lines.append(f"  total {self.n_params():,d} parameters")
        return "\n".join(lines)

    def n_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.param_shapes.values())

    @property
    def has_dropout(self) -> bool:
        return any(isinstance(l, Dropout) for l in self.layers)

    def layer(self, name: str) -> Layer:
        """The bound layer called ``name`` (``KeyError`` naming the layers if none)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(
            f"network {self.name!r} has no layer {name!r}; it has "
            f"{[l.name for l in self.layers]}"
        )

    def input_shape(self, name: str) -> tuple[int, ...]:
        """(C, H, W) (or (units,)) entering layer ``name``."""
        return self.input_shapes[self.layers.index(self.layer(name))]

    # ------------------------------------------------------------------ params

    def init_params(self, seed: Any, init: str = "he") -> dict[str, np.ndarray]:
        """Fresh float32 parameters, drawn in layer order from ``default_rng(seed)``.

        Parameters
        ----------
        seed : int or sequence of int
            Seed of the generator (the example's trainer passes
            ``[seed, INIT_STREAM]``).
        init : {"he", "cc2"}
            See the module docstring.
        """
        if init not in INITS:
            raise self.error(f"--init must be one of {INITS}, got {init!r}")
        rng = np.random.default_rng(seed)
        last = [l for l in self.layers if isinstance(l, (Conv, FC))][-1]
        out: dict[str, np.ndarray] = {}
        for layer in self.layers:
            if not isinstance(layer, (Conv, FC)):
                continue
            w_shape = self.param_shapes[f"{layer.name}.W"]
            fan_in = (
                int(np.prod(w_shape[1:])) if isinstance(layer, Conv) else w_shape[0]
            )
            if init == "he":
                std = np.sqrt((1.0 if layer is last else 2.0) / fan_in)
                bias = 0.0
            else:
                std, bias = layer.init_std, layer.init_bias
            out[f"{layer.name}.W"] = (rng.standard_normal(w_shape) * std).astype(
                np.float32
            )
            out[f"{layer.name}.b"] = np.full(
                self.param_shapes[f"{layer.name}.b"], bias, dtype=np.float32
            )
        return out

    # ------------------------------------------------------------------- graph

    def dropout_layers(self) -> list[Dropout]:
        """The dropout layers, in order."""
        return [l for l in self.layers if isinstance(l, Dropout)]

    def make_dropout_states(
        self, seed: Sequence[int], device: int | None = None
    ) -> dict[str, Any]:
        """One fresh random state (a shared variable) per dropout layer.

        Layer ``i``'s state is seeded from ``SeedSequence([*seed, i])`` (the
        example's trainer passes ``[seed, DROPOUT_STREAM]``): a
        ``cc2ops.dropout_state``. One state per layer keeps the layers' masks
        independent (cc2ops allows one dropout per state). ``device``: the
        GPU label the states live on (``None``: the host).
        """
        states: dict[str, Any] = {}
        for i, layer in enumerate(self.dropout_layers()):
            seq = np.random.SeedSequence([*seed, i])
            name = f"{layer.name}.state"
            states[layer.name] = cc2ops.dropout_state(
                int(seq.generate_state(1, np.uint64)[0]), name=name, device=device
            )
        return states

    def forward(
        self,
        x: pt.TensorVariable,
        params: Mapping[str, Any],
        *,
        train: bool,
        dropout_states: Mapping[str, Any] | None = None,
    ) -> pt.TensorVariable:
        """Logits (B, n_classes) of images ``x`` (B, 3, crop, crop).

        Parameters
        ----------
        x : TensorVariable, float32
            Normalised images in bc01 order.
        params : dict
            Name -> shared variable, as :attr:`param_shapes`.
        train : bool
            Training graphs apply dropout; evaluation graphs do not (nor does
            a training step built without dropout).
        dropout_states : dict, optional
            :meth:`make_dropout_states`; needed for training graphs of
            networks with dropout.

        Returns
        -------
        logits : TensorVariable
            The dropout states advance through their default updates.
        """
        h = x
        for layer in self.layers:
            if isinstance(layer, Conv):
                w, b = params[f"{layer.name}.W"], params[f"{layer.name}.b"]
                h = cc2ops.conv2d(
                    h, w, stride=layer.stride, padding=layer.pad, groups=layer.groups
                )
                h = h + b.dimshuffle("x", 0, "x", "x")
            elif isinstance(layer, Pool):
                pool = cc2ops.max_pool2d if layer.kind == "max" else cc2ops.avg_pool2d
                h = pool(h, layer.size, layer.stride)
            elif isinstance(layer, RNorm):
                h = cc2ops.cross_map_norm(
                    h, size=layer.size, alpha=layer.alpha, beta=layer.beta, k=layer.k
                )
            elif isinstance(layer, FC):
                if h.ndim > 2:
                    h = h.flatten(2)
                h = pt.dot(h, params[f"{layer.name}.W"]) + params[f"{layer.name}.b"]
            elif isinstance(layer, Dropout):
                if not train:
                    continue
                if dropout_states is None or layer.name not in dropout_states:
                    raise self.error(
                        f"layer {layer.name}: a training graph with dropout needs "
                        "the network's dropout states (make_dropout_states)"
                    )
                h = cc2ops.dropout(h, layer.p, dropout_states[layer.name])
            if getattr(layer, "relu", False):
                h = pt.maximum(h, np.asarray(0, dtype=h.dtype))
        return h


# --------------------------------------------------------------------------
# the training step
# --------------------------------------------------------------------------


@dataclass
class StepGraph:
    """The symbolic results of :func:`training_step`.

    Attributes
    ----------
    loss : variable
        The mean softmax cross-entropy (after ``distribute``).
    error : variable or None
        The mean top-1 error (after ``distribute``); ``None`` when not asked.
    updates : list of (shared, expression)
        ``(velocity, new velocity), (parameter, new parameter)`` per
        parameter, in :attr:`Network.param_shapes` order.
    logits : variable
        (B, classes), before ``distribute``.
    """

    loss: Any
    error: Any
    updates: list
    logits: Any


def training_step(
    net: Network,
    images: Any,
    labels: Any,
    params: Mapping[str, Any],
    velocities: Mapping[str, Any],
    *,
    lr: Any,
    momentum: float,
    weight_decay: float,
    dropout_states: Mapping[str, Any] | None = None,
    distribute: Callable[[list], list] | None = None,
    error: bool = True,
) -> StepGraph:
    """The loss, error and momentum-SGD updates of one training step.

    Parameters
    ----------
    net : Network
    images : TensorVariable, float32
        (B, 3, crop, crop), bc01 (host variables; a GPU input's host view).
    labels : TensorVariable, int32
        (B,), in ``[0, net.n_classes)``.
    params, velocities : mapping of name -> shared variable
        Keyed like :attr:`Network.param_shapes`; host or GPU shared variables.
    lr : float or scalar variable
        The learning rate (a variable: an input of every call, as the
        example's schedule needs).
    momentum, weight_decay : float
        See the module docstring; ``weight_decay`` applies to the ``.W``
        parameters only, and ``0`` leaves the gradient alone.
    dropout_states : mapping, optional
        :meth:`Network.make_dropout_states`: dropout on. ``None``: a step
        without dropout (the net's dropout layers are skipped).
    distribute : callable, optional
        ``distribute([loss, error]) -> [loss, error]`` (or ``[loss]`` with
        ``error=False``), applied before the gradients: the multi-device
        rewriter's hook (``multi_gpu.distribute``); its gradients equal the
        single-device ones.
    error : bool
        Also compute the top-1 error.

    Returns
    -------
    StepGraph

    Notes
    -----
    Each scalar of the update rule takes the parameter's dtype, so a float32
    step has no float64 node (precision is the mode's choice, not the
    graph's).
    """
    logits = net.forward(
        images,
        params,
        train=dropout_states is not None,
        dropout_states=dropout_states,
    )
    outs = [cc2ops.softmax_cross_entropy(logits, labels).mean()]
    if error:
        outs.append(cc2ops.top_k_error(logits, labels, k=1).mean())
    if distribute is not None:
        outs = list(distribute(outs))
    loss = outs[0]
    names = list(net.param_shapes)
    grads = pytensor.grad(loss, [params[n] for n in names])
    updates = []
    for name, g in zip(names, grads, strict=True):
        p, v = params[name], velocities[name]
        scalar = np.dtype(p.type.dtype).type
        if name.endswith(".W") and weight_decay:
            g = g + scalar(weight_decay) * p
        v_new = scalar(momentum) * v - lr * g
        updates += [(v, v_new), (p, p + v_new)]
    return StepGraph(
        loss=loss, error=outs[1] if error else None, updates=updates, logits=logits
    )


@dataclass(frozen=True)
class StepConfig:
    """A net at a batch size with its optimiser settings: what a benchmark times.

    Parameters
    ----------
    net : str
        A key of :data:`NETS`.
    batch : int
    crop, classes : int, optional
        Input size and classes (default: the net's, :data:`NET_INPUTS`).
    width_mult : float
        See :class:`Network`.
    dropout : bool
        Apply the net's dropout layers in the step (nets without any: no
        effect).
    lr, momentum, weight_decay : float
        The step's constant learning rate and the SGD settings.
    seed : int
        Seed of :meth:`Network.init_params` (``"he"``) for :meth:`init_params`.
    """

    net: str = "imagenet"
    batch: int = 128
    crop: int | None = None
    classes: int | None = None
    width_mult: float = 1.0
    dropout: bool = True
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.net not in NET_INPUTS:
            raise NetworkError(
                f"unknown network {self.net!r}; choose from {sorted(NET_INPUTS)}"
            )
        crop, classes = NET_INPUTS[self.net]
        if self.crop is None:
            object.__setattr__(self, "crop", crop)
        if self.classes is None:
            object.__setattr__(self, "classes", classes)

    @property
    def name(self) -> str:
        """``"<net>_step_b<batch>"``: the benchmark row name."""
        return f"{self.net}_step_b{self.batch}"

    @property
    def image_shape(self) -> tuple[int, int, int, int]:
        """(batch, 3, crop, crop) of the images."""
        return (self.batch, 3, self.crop, self.crop)

    def with_(self, **changes: Any) -> StepConfig:
        """A copy with some fields replaced."""
        return replace(self, **changes)

    def network(self) -> Network:
        """The bound :class:`Network`."""
        return Network(self.net, self.classes, self.crop, self.width_mult)

    def init_params(self) -> dict[str, np.ndarray]:
        """``network().init_params(seed, "he")``: float32 numpy values."""
        return self.network().init_params(self.seed, "he")


@dataclass
class Step:
    """A built training step: what ``pytensor.function`` takes.

    Attributes
    ----------
    inputs : list
        ``[images (B, 3, crop, crop) float32, labels (B,) int32]`` (host
        tensors, or GPU variables with ``gpu_inputs``).
    outputs : list
        ``[loss, top-1 error]`` scalars (``[loss]`` with ``error=False``;
        batch means; GPU scalars with ``gpu_outputs``).
    updates : list of (shared, expression)
        Parameter and velocity updates.
    params, velocities : dict of name -> shared variable
        Keyed like :attr:`Network.param_shapes` (velocities are named
        ``"<name>.momentum"``, as the example's checkpoints).
    logits : variable
        (B, classes), for inspection.
    config : StepConfig
    network : Network
    dropout_states : list of shared variables
        One ``cc2ops.dropout_state`` per dropout layer when dropout is on
        (their counter advances are default updates, which
        ``pytensor.function`` adds); on the GPU with ``gpu_params``.
    """

    inputs: list
    outputs: list
    updates: list
    params: dict[str, Any]
    velocities: dict[str, Any]
    logits: Any
    config: StepConfig
    network: Network
    dropout_states: list = field(default_factory=list)

    def function(self, mode: Any, **kwargs: Any) -> Any:
        """``pytensor.function(inputs, outputs, updates=updates, mode=mode)``."""
        return pytensor.function(
            self.inputs, self.outputs, updates=self.updates, mode=mode, **kwargs
        )


def build_step(
    cfg: StepConfig,
    values: Mapping[str, np.ndarray] | None = None,
    *,
    gpu_params: bool = False,
    device: int = 0,
    dropout_seed: int = 1234,
    static_batch: bool = True,
    gpu_inputs: bool = False,
    gpu_outputs: bool = False,
    share: Callable[[np.ndarray, str], Any] | None = None,
    distribute: Callable[[list], list] | None = None,
    error: bool = True,
) -> Step:
    """Build the training step graph of ``cfg`` (:func:`training_step`).

    Parameters
    ----------
    cfg : StepConfig
    values : dict of name -> ndarray, optional
        Initial parameters (default ``cfg.init_params()``); copied into
        shared variables. Velocities start at zero.
    gpu_params : bool
        Parameters, velocities and dropout states as GPU shared variables on
        device label ``device`` (made through :mod:`cc2ops.seam`; creating
        them never touches CUDA) instead of host ``pytensor.shared``.
    dropout_seed : int
        The dropout states are ``Network.make_dropout_states([dropout_seed])``.
    static_batch : bool
        Give the image and label inputs the static batch size ``cfg.batch``.
    gpu_inputs : bool
        Images and labels as GPU variables on ``device`` (the caller passes
        device arrays: no per-step upload).
    gpu_outputs : bool
        Return the outputs as GPU scalars (no per-step download, so a step
        never waits for the device).
    share : callable, optional
        ``share(value, name)`` makes each parameter and velocity instead
        (for example GPU variables on another label, or host variables
        without a static shape); overrides ``gpu_params`` for them.
    distribute : callable, optional
        The multi-device hook of :func:`training_step`.
    error : bool
        Also output the top-1 error.

    Returns
    -------
    Step
    """
    net = cfg.network()
    if values is None:
        values = net.init_params(cfg.seed, "he")
    if share is None:
        if gpu_params:

            def share(value: np.ndarray, name: str) -> Any:
                return seam.backend().shared(
                    value, device=device, name=name, shape=value.shape
                )

        else:

            def share(value: np.ndarray, name: str) -> Any:
                return pytensor.shared(value, name=name, shape=value.shape)

    b = cfg.batch if static_batch else None
    image_shape = (b, 3, cfg.crop, cfg.crop)
    if gpu_inputs:
        gpu = seam.backend()
        x_in = gpu.variable("float32", image_shape, device, "images")
        y_in = gpu.variable("int32", (b,), device, "labels")
        x, y = gpu.to_host(x_in), gpu.to_host(y_in)
    else:
        x = x_in = pt.tensor("images", dtype="float32", shape=image_shape)
        y = y_in = pt.tensor("labels", dtype="int32", shape=(b,))
    params = {
        name: share(np.asarray(values[name], np.float32), name)
        for name in net.param_shapes
    }
    velocities = {
        name: share(np.zeros(shape, np.float32), f"{name}.momentum")
        for name, shape in net.param_shapes.items()
    }
    states = None
    if cfg.dropout and net.has_dropout:
        states = net.make_dropout_states([dropout_seed], device if gpu_params else None)
    graph = training_step(
        net,
        x,
        y,
        params,
        velocities,
        lr=np.float32(cfg.lr),
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        dropout_states=states,
        distribute=distribute,
        error=error,
    )
    outputs = [graph.loss] + ([graph.error] if error else [])
    if gpu_outputs:
        to_device = seam.backend().to_device
        outputs = [to_device(v, device) for v in outputs]
    return Step(
        inputs=[x_in, y_in],
        outputs=outputs,
        updates=graph.updates,
        params=params,
        velocities=velocities,
        logits=graph.logits,
        config=cfg,
        network=net,
        dropout_states=list(states.values()) if states else [],
    )
