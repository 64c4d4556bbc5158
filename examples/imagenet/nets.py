"""The example's networks: cc2ops's net table, bound to the command line.

The layer records, the nets and :class:`Network` (shapes by
:mod:`cc2ops.shapes`, parameters, the graph built with the public cc2ops
ops) are :mod:`cc2ops.testing.nets`, the one definition of the cuda-convnet2
nets that the benchmarks and the tests use too; read its docstring for what
``imagenet`` (cuda-convnet2's ``layers-imagenet-1gpu.cfg``) and ``small``
(its CIFAR-10 "11pct" layout) are and how they differ from the cfg files.
The training step is its :func:`cc2ops.testing.nets.training_step`.

This module adds what the command line needs before the heavy imports:
the two nets it offers (:data:`NETS`), their defaults (:data:`NET_DEFAULTS`),
:class:`NetworkError`, and the checkpoint form of dropout states. PyTensor
and cc2ops (seconds to import) are imported when a network is built or a
table name (``Network``, ``Conv``, ...) is first used, so that train.py
answers ``--help`` and flag errors at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cc2ops.testing.nets import Layer, Network  # noqa: F401

INITS = ("he", "cc2")
#: The names this module takes from cc2ops.testing.nets on first use.
_TABLE_NAMES = ("Conv", "Pool", "RNorm", "FC", "Dropout", "Layer")


class NetworkError(ValueError):
    """A network that cannot be built as asked (unknown name, input too small)."""


def imagenet_layers() -> tuple[Layer, ...]:
    """cuda-convnet2's ``layers-imagenet-1gpu`` (:mod:`cc2ops.testing.nets`)."""
    from cc2ops.testing import nets as table

    return table.imagenet_layers()


def small_layers() -> tuple[Layer, ...]:
    """cuda-convnet2's CIFAR-10 ``11pct`` layout (:mod:`cc2ops.testing.nets`)."""
    from cc2ops.testing import nets as table

    return table.small_layers()


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

_NETWORK: type | None = None


def _network_class() -> type:
    """:class:`cc2ops.testing.nets.Network` offering :data:`NETS` and raising
    :class:`NetworkError` (made once, on first use)."""
    global _NETWORK
    if _NETWORK is None:
        from cc2ops.testing import nets as table

        class Network(table.Network):
            """:class:`cc2ops.testing.nets.Network` with the example's nets
            (``"imagenet"``, ``"small"``) and :class:`NetworkError`.

            ``Network(name, n_classes, crop, width_mult=1.0)``.
            """

            nets = NETS
            error = NetworkError

        Network.__module__ = __name__
        Network.__qualname__ = "Network"
        _NETWORK = Network
    return _NETWORK


def __getattr__(name: str) -> Any:
    # PEP 562: the table's names resolve (importing cc2ops) on first use only
    if name == "Network":
        return _network_class()
    if name in _TABLE_NAMES:
        from cc2ops.testing import nets as table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
