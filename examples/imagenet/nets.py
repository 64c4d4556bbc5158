"""The example's networks, written as data and built with the cc2ops ops.

A network is a tuple of layer records (:class:`Conv`, :class:`Pool`,
:class:`RNorm`, :class:`FC`, :class:`Dropout`). :class:`Network` walks it once
with the shape rules of :mod:`cc2ops.shapes` (so an input that is too small is
reported before anything is compiled), creates the parameters, and builds the
PyTensor graph with the public cc2ops functions: ``cc2ops.conv2d``,
``cc2ops.max_pool2d`` / ``cc2ops.avg_pool2d``, ``cc2ops.cross_map_norm``;
``pt.dot`` for the fully connected layers, ``pt.maximum(x, 0)`` for ReLU.
Dropout uses ``cc2ops.dropout`` with one ``cc2ops.dropout_state`` per layer
(so the GPU mode runs it on the GPU). Everything is in bc01 order, (B, C, H, W).

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

Initialisation: ``"he"`` (default) draws N(0, 2/fan_in) weights (1/fan_in
for the classifier) and zero biases, which trains the small net in a few
epochs from the first step; ``"cc2"`` uses the cfg files' per-layer
``initW`` standard deviations and ``initB`` biases.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pytensor.tensor as pt

# PyTensor and cc2ops (seconds to import) are imported where a network is
# built, so that train.py answers --help and flag errors at once

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


NETS = {"imagenet": imagenet_layers, "small": small_layers}
#: Per-network defaults of the command line (input geometry, batch, schedule).
NET_DEFAULTS: dict[str, dict[str, Any]] = {
    "imagenet": dict(
        scale=256,
        crop=224,
        batch_size=128,
        lr=0.01,
        lr_schedule="step",
        lr_step_epochs=20,
        warmup_epochs=0.0,
        weight_decay=5e-4,
        epochs=90,
    ),
    "small": dict(
        scale=36,
        crop=32,
        batch_size=64,
        lr=0.01,
        lr_schedule="cosine",
        lr_step_epochs=10,
        warmup_epochs=0.5,
        weight_decay=5e-4,
        epochs=8,
    ),
}


def _scaled(units: int, width_mult: float, groups: int = 1) -> int:
    # keep at least one unit per group and a multiple of the groups
    per_group = max(1, round(units * width_mult / groups))
    return per_group * groups


class Network:
    """A layer list bound to an input size and a number of classes.

    Parameters
    ----------
    name : {"imagenet", "small"}
    n_classes : int
        Outputs of the last layer (its ``units=None``).
    crop : int
        Input images are (B, 3, crop, crop).
    width_mult : float
        Multiplies every layer's filter / unit count (not the classes); < 1
        gives the fast variants the tests use.

    Raises
    ------
    NetworkError
        Unknown name, ``width_mult <= 0``, fewer than 2 classes, or an input
        too small for some layer (the message names the layer and the rule).
    """

    def __init__(
        self, name: str, n_classes: int, crop: int, width_mult: float = 1.0
    ) -> None:
        if name not in NETS:
            raise NetworkError(f"unknown network {name!r}; choose from {sorted(NETS)}")
        if not width_mult > 0:
            raise NetworkError(f"--width-mult must be > 0, got {width_mult}")
        if n_classes < 2:
            raise NetworkError(f"a classifier needs >= 2 classes, got {n_classes}")
        self.name = name
        self.n_classes = int(n_classes)
        self.crop = int(crop)
        self.width_mult = float(width_mult)
        layers = []
        for layer in NETS[name]():
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
        self.output_shapes, self.param_shapes = self._walk()

    def _walk(self) -> tuple[list[tuple[int, ...]], dict[str, tuple[int, ...]]]:
        shape: tuple[int, ...] = (3, self.crop, self.crop)
        out_shapes = []
        params: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            try:
                shape = self._layer_shape(layer, shape, params)
            except ValueError as e:
                raise NetworkError(
                    f"network {self.name!r} does not fit {self.crop}x{self.crop} "
                    f"inputs: layer {layer.name} gets {shape}: {e}"
                ) from e
            out_shapes.append(shape)
        return out_shapes, params

    @staticmethod
    def _layer_shape(layer: Layer, shape, params) -> tuple[int, ...]:
        from cc2ops import shapes

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

    # ------------------------------------------------------------------ params

    def init_params(self, seed: int, init: str = "he") -> dict[str, np.ndarray]:
        """Fresh float32 parameters, drawn in layer order from ``default_rng(seed)``.

        Parameters
        ----------
        seed : int or sequence of int
            Seed of the generator (the trainer passes ``[seed, INIT_STREAM]``).
        init : {"he", "cc2"}
            See the module docstring.
        """
        if init not in INITS:
            raise NetworkError(f"--init must be one of {INITS}, got {init!r}")
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
        trainer passes ``[seed, DROPOUT_STREAM]``): a ``cc2ops.dropout_state``.
        One state per layer keeps the layers' masks independent (cc2ops allows
        one dropout per state). ``device``: the GPU label the states live on
        (``None``: the host).
        """
        import cc2ops

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
        params: dict[str, Any],
        *,
        train: bool,
        dropout_states: dict[str, Any] | None = None,
    ) -> pt.TensorVariable:
        """Logits (B, n_classes) of images ``x`` (B, 3, crop, crop).

        Parameters
        ----------
        x : TensorVariable, float32
            Normalised images in bc01 order.
        params : dict
            Name -> shared variable, as :attr:`param_shapes`.
        train : bool
            Training graphs apply dropout; evaluation graphs do not.
        dropout_states : dict, optional
            :meth:`make_dropout_states`; needed for training graphs of
            networks with dropout.

        Returns
        -------
        logits : TensorVariable
            The dropout states advance through their default updates.
        """
        import pytensor.tensor as pt

        import cc2ops

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
                    raise NetworkError(
                        f"layer {layer.name}: a training graph with dropout needs "
                        "the network's dropout states (make_dropout_states)"
                    )
                h = cc2ops.dropout(h, layer.p, dropout_states[layer.name])
            if getattr(layer, "relu", False):
                h = pt.maximum(h, np.asarray(0, dtype=h.dtype))
        return h


def get_dropout_state(state: Any) -> tuple[str, Any]:
    """``("cc2ops", value)`` of a dropout state for a checkpoint: its four
    Philox words as a host array."""
    value = state.get_value(borrow=True)
    if not isinstance(value, np.ndarray) and hasattr(value, "get"):
        value = value.get()  # a GPUArray
    return "cc2ops", np.array(value, copy=True)


def set_dropout_state(state: Any, kind: str, value: Any) -> None:
    """Restore a value from :func:`get_dropout_state` (raises on a kind mismatch)."""
    if kind != "cc2ops":
        raise NetworkError(
            f"dropout state {state.name}: the checkpoint holds a {kind!r} state but "
            "this example uses cc2ops dropout"
        )
    state.set_value(np.asarray(value))
