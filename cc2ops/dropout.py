"""Dropout with counter-based random masks (Philox4x32-10), reproducible from a seed.

``state = dropout_state(seed)`` is a shared uint32 vector ``(key0, key1,
counter_lo, counter_hi)`` on the host; ``dropout_state(seed, device=d)`` is
the same vector as a GPU shared variable (:func:`cc2ops.cuda.shared`) on
device label ``d``. ``dropout(x, p, state)`` is ``x * mask / (1 - p)``.

The bit rule (written once, here; ``kernels/dropout.cu`` implements the same)
-------------------------------------------------------------------------------
With the 64-bit counter ``C = counter_lo + 2**32 * counter_hi`` and the key
``(key0, key1)``, element ``i`` of ``x`` (C order, ``x.size`` elements) uses
word ``i % 4`` of ``philox4x32_10(counter=(b_lo, b_hi, 0, 0), key)`` where
``b = (C + i // 4) mod 2**64``; it is kept when that uint32 word is below
``T = floor((1 - p) * 2**32)`` (``p = 0`` keeps everything), and a kept
element is ``x[i] * s`` with ``s = 1 / (1 - p)`` in ``x``'s dtype.

Each call of a compiled function advances the counter by ``ceil(x.size /
4)`` (the state's ``default_update``), so every step draws new masks and a
run is reproducible from the seed. The gradient recomputes the same mask from
the same state value (a compiled function reads the state's value from before
its update for the whole call and stores the update at the end), so the
pullback of ``Dropout`` is ``Dropout`` itself applied to the cotangent.

Where the state lives
---------------------
A host state drives the host op ``Dropout`` (lifted to ``GpuDropout`` in the
GPU mode, which then reads the four words on the host and passes them as
kernel arguments) and its advance is the host op ``DropoutAdvance``. A GPU
state drives ``GpuDropout`` directly (the kernel reads the state from device
memory) and its advance is ``GpuDropoutAdvance`` (a one-thread kernel), so a
GPU training step has no host node and no host read for dropout; see
:mod:`cc2ops.cuda.ops.dropout`. The masks are the same bits either way.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Variable
from pytensor.tensor.type import TensorType

from cc2ops import seam
from cc2ops._op import FLOAT_DTYPES, INT_DTYPES, Cc2Op, as_tensor

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "philox4x32_reference",
    "keep_threshold",
    "dropout_scale",
    "dropout_mask_reference",
    "advance_state",
    "dropout_state",
    "dropout",
    "Dropout",
    "DropoutAdvance",
    "check_p",
    "check_state_value",
    "state_counter",
    "state_variable",
    # the skeletons the host ops share with their GPU twins
    "DropoutFamily",
    "HOST_FAMILY",
    "DropoutSkeleton",
    "DropoutAdvanceSkeleton",
]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
_U32 = np.uint64(0xFFFFFFFF)


def philox4x32_reference(counters: Any, key: Any, rounds: int = 10) -> np.ndarray:
    """Philox4x32 (Salmon et al., SC'11; Random123) in vectorised numpy.

    Parameters
    ----------
    counters : array-like of uint32, shape (..., 4)
        Counter words ``(c0, c1, c2, c3)``.
    key : array-like of uint32, shape (2,) or (..., 2)
        Key words ``(k0, k1)``.
    rounds : int
        10 for Philox4x32-10.

    Returns
    -------
    ndarray of uint32, shape (..., 4)
    """
    c = np.asarray(counters, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(
            "philox4x32_reference: counters must have shape (..., 4) and key (..., 2), "
            f"got {c.shape} and {k.shape}"
        )
    c0, c1, c2, c3 = (c[..., j] for j in range(4))
    k0, k1 = k[..., 0] + np.zeros_like(c0), k[..., 1] + np.zeros_like(c0)
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    for r in range(rounds):
        if r:
            k0 = (k0 + w0) & _U32
            k1 = (k1 + w1) & _U32
        p0 = m0 * c0  # 32 x 32 -> 64 bits, exact in uint64
        p1 = m1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _U32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _U32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def keep_threshold(p: float) -> int:
    """``T = floor((1 - p) * 2**32)``: a word below ``T`` keeps its element."""
    return int(math.floor((1.0 - float(p)) * 2.0**32))


def dropout_scale(p: float, dtype: Any) -> np.generic:
    """The factor ``1 / (1 - p)`` of kept elements, in ``dtype``."""
    return np.dtype(dtype).type(1.0 / (1.0 - float(p)))


def state_counter(state: np.ndarray) -> int:
    """The 64-bit counter ``C = counter_lo + 2**32 * counter_hi`` of a state value."""
    return int(state[2]) | (int(state[3]) << 32)


def dropout_mask_reference(state: Any, n: int, p: float) -> np.ndarray:
    """The keep mask (bool, ``n`` elements, C order) for a state value and ``p``."""
    state = np.asarray(state, dtype=np.uint32)
    blocks = -(-int(n) // 4)
    b = (
        np.uint64(state_counter(state)) + np.arange(blocks, dtype=np.uint64)
    ) & np.uint64(2**64 - 1)
    counters = np.zeros((blocks, 4), np.uint64)
    counters[:, 0] = b & _U32
    counters[:, 1] = b >> np.uint64(32)
    words = philox4x32_reference(counters, state[:2]).reshape(-1)[: int(n)]
    return words.astype(np.uint64) < np.uint64(keep_threshold(p))


def advance_state(state: Any, n: int) -> np.ndarray:
    """The state after a dropout of ``n`` elements: counter + ceil(n / 4), mod 2**64."""
    state = np.asarray(state, dtype=np.uint32)
    c = (state_counter(state) + (-(-int(n) // 4))) % 2**64
    out = state.copy()
    out[2], out[3] = c & 0xFFFFFFFF, c >> 32
    return out


def check_state_value(op: str, state: np.ndarray) -> None:
    """A state value (host or GPU array) must be 4 uint32 words; ``ValueError``
    naming ``op`` else. Reads only its shape and dtype."""
    if state.shape != (4,) or state.dtype != np.uint32:
        raise ValueError(
            f"{op}: the dropout state must be a uint32 vector of 4 words "
            f"(key0, key1, counter_lo, counter_hi), got {state.dtype} {state.shape}"
        )


def check_p(p: Any, op: str = "dropout") -> float:
    """``p`` as a float in ``[0, 1)``.

    Only real numbers are accepted (int, float, NumPy scalars): a string is
    not parsed and a bool is not read as 0 or 1, since either is more likely a
    slip than a probability.
    """
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(
            f"{op}: p must be a real number (int, float or NumPy scalar; not a "
            f"bool or a string) with 0 <= p < 1, got {type(p).__name__} {p!r}"
        )
    value = float(p)
    if not 0.0 <= value < 1.0 or math.isnan(value):
        raise ValueError(f"{op}: p must satisfy 0 <= p < 1, got {p!r}")
    return value


def state_variable(op: str, state: Any) -> Variable:
    """``state`` as a host uint32 vector variable, else ``TypeError``."""
    state = as_tensor(op, "state", state)
    if state.type.dtype != "uint32" or state.type.ndim != 1:
        raise TypeError(
            f"{op}: state must be the uint32 vector of dropout_state(), got "
            f"{state.type}"
        )
    return state


def _float_input(op: str, x: Any) -> Variable:
    """``x`` as a float32/float64 tensor of any shape, else ``TypeError``."""
    x = as_tensor(op, "x", x)
    if x.type.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: x must be float32 or float64, got {x.type.dtype}")
    return x


class DropoutFamily(NamedTuple):
    """The dropout op classes of one backend by role: a skeleton's ``family``
    (:mod:`cc2ops._op`; :data:`HOST_FAMILY` here, ``GPU_FAMILY`` on the GPU)."""

    dropout: type
    advance: type


class DropoutSkeleton:
    """:class:`Dropout` and its GPU twin but for props, ``make_node`` and
    ``perform``.

    ``(x, state) -> y``: the shape rule, connection pattern (the state gets
    no gradient), pullback and pushforward: ``family.dropout`` of the
    cotangent or tangent with the same state variable. A compiled function
    reads every state's value from before its update for the whole call, so
    that is the same mask.
    """

    p: float
    family: ClassVar[DropoutFamily]

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[True], [False]]

    def pullback(self, inputs, outputs, cotangents):
        x, state = inputs
        (g,) = cotangents
        g = self._on_device(g, x)
        return [self.family.dropout(self.p)(g, state), disconnected_type()]

    def pushforward(self, inputs, outputs, tangents):
        x, state = inputs
        dx = self._on_device(tangents[0], x)
        return [self.family.dropout(self.p)(dx, state)]


class DropoutAdvanceSkeleton:
    """:class:`DropoutAdvance` and its GPU twin but for ``make_node`` and
    ``perform``: a new 4-word state, no gradient to anything."""

    family: ClassVar[DropoutFamily]

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [(4,)]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[False], [False]]

    def pullback(self, inputs, outputs, cotangents):
        return [disconnected_type(), disconnected_type()]


class _HostOp(Cc2Op):
    """The host ops' base: the host op machinery."""


class Dropout(DropoutSkeleton, _HostOp):
    """``x * mask / (1 - p)`` with the Philox mask of the state (module docstring).

    Parameters
    ----------
    p : float
        Drop probability, ``0 <= p < 1``.

    Notes
    -----
    Inputs ``(x, state)``: ``x`` any float tensor (any axis order: the
    element index is the C-order index), ``state`` the uint32 vector of
    :func:`dropout_state`. The pullback is ``Dropout(p)(gy, state)`` (the same
    mask); the state gets no gradient.
    """

    __props__ = ("p",)

    def __init__(self, p: float) -> None:
        self.p = check_p(p, "Dropout")

    def make_node(self, x: Any, state: Any) -> Apply:
        x = _float_input("Dropout", x)
        state = state_variable("Dropout", state)
        return Apply(self, [x, state], [x.type()])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        x, state = inputs
        check_state_value("Dropout", np.asarray(state))
        mask = dropout_mask_reference(state, x.size, self.p).reshape(x.shape)
        scale = dropout_scale(self.p, x.dtype)
        outputs[0][0] = np.where(mask, x * scale, x.dtype.type(0)).astype(x.dtype)


class DropoutAdvance(DropoutAdvanceSkeleton, _HostOp):
    """The dropout state with its counter advanced by ``ceil(n / 4)`` (mod 2**64).

    Inputs ``(state, n)``: the uint32 state vector and the int64 element count.
    """

    __props__ = ()

    def make_node(self, state: Any, n: Any) -> Apply:
        state = state_variable("DropoutAdvance", state)
        n = as_tensor("DropoutAdvance", "n", n)
        if n.type.ndim != 0 or n.type.dtype not in INT_DTYPES:
            raise TypeError(
                "DropoutAdvance: n must be an integer scalar (the element count), "
                f"got {n.type}"
            )
        return Apply(self, [state, n], [TensorType("uint32", (4,))()])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        state, n = inputs
        check_state_value("DropoutAdvance", np.asarray(state))
        outputs[0][0] = advance_state(state, int(n))


#: The host ops by role (their skeletons' ``family``).
HOST_FAMILY = DropoutFamily(Dropout, DropoutAdvance)
_HostOp.family = HOST_FAMILY


def dropout_state(
    seed: int, name: str | None = None, device: int | None = None
) -> SharedVariable:
    """A fresh dropout state: a shared uint32 vector ``(key0, key1, 0, 0)``.

    Parameters
    ----------
    seed : int
        ``0 <= seed < 2**64``; ``key0`` is its low and ``key1`` its high 32 bits.
    name : str, optional
    device : int, optional
        ``None`` (default): a host shared variable. A device label: a GPU
        shared variable (:func:`cc2ops.cuda.shared`, static shape ``(4,)``)
        on that device; creating it does not touch CUDA (the value is
        uploaded when a function using it is linked in the GPU mode).

    Returns
    -------
    SharedVariable
        ``get_value()`` returns the four words as a numpy uint32 array in
        both cases (downloaded from the GPU once uploaded); ``set_value``
        takes them back (a checkpoint restores a state this way).

    Notes
    -----
    One state drives one dropout call per graph (give each dropout layer its
    own state, e.g. ``dropout_state(seed + k)``): the state's default update
    is that call's counter advance. With a host state, ``GpuDropout`` reads
    the four words on the host as kernel arguments and the advance is a tiny
    host op; with a GPU state everything, the advance included, stays on the
    device. A GPU state needs CUDA when the function is compiled, whatever
    the mode.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(
            f"dropout_state: seed must be an int, got {type(seed).__name__} {seed!r}"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"dropout_state: name must be None or a str, got {type(name).__name__} "
            f"{name!r}"
        )
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(
            f"dropout_state: seed must satisfy 0 <= seed < 2**64, got {seed}"
        )
    value = np.array([seed & 0xFFFFFFFF, seed >> 32, 0, 0], dtype=np.uint32)
    if device is None:
        state = pytensor.shared(value, name=name, shape=(4,))
    else:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise TypeError(
                "dropout_state: device must be None or an int device label, got "
                f"{type(device).__name__} {device!r}"
            )
        if device < 0:
            raise ValueError(f"dropout_state: device must be >= 0, got {device}")
        state = seam.backend().shared(value, device=int(device), name=name, shape=(4,))
    state.tag.cc2ops_dropout_state = True
    return state


def _is_gpu_state(state: SharedVariable) -> bool:
    # the GPU backend registered itself with cc2ops.seam when it was imported;
    # cc2ops.dropout never imports it (a GPU state cannot exist without it)
    return seam.is_gpu_variable(state)


def dropout(x: Any, p: float, state: SharedVariable) -> Variable:
    """``x * mask / (1 - p)``, the mask drawn from ``state`` (module docstring).

    Parameters
    ----------
    x : tensor, float32 or float64, any shape and axis order
        A host tensor or a GPU variable.
    p : float
        Drop probability, ``0 <= p < 1`` (``p == 0`` returns ``x``).
    state : SharedVariable
        From :func:`dropout_state`; it gets the default update that advances
        its counter by ``ceil(x.size / 4)`` per call of a compiled function.

    Returns
    -------
    TensorVariable
        A host tensor of the same shape and dtype as ``x``. With a host state
        it is ``Dropout(p)(x, state)`` (lifted in the GPU mode); with a GPU
        state on device ``d`` it is ``host_from_gpu(GpuDropout(p)(x on d,
        state))`` (the GPU mode cancels the transfers next to GPU data), and
        the default update is ``GpuDropoutAdvance()(state, x on d)``.

    Raises
    ------
    ValueError
        ``p`` outside ``[0, 1)`` (or NaN), or a state that already drives a
        dropout.
    TypeError
        ``p`` is not a real number (a bool or a string is refused, not read as
        a number); ``x`` is not a float32/float64 tensor; ``state`` is not a
        dropout state.
    """
    p = check_p(p)
    x = _float_input("dropout", x)
    if not (
        isinstance(state, SharedVariable)
        and getattr(state.tag, "cc2ops_dropout_state", False)
    ):
        raise TypeError(
            "dropout: state must be a shared variable made by dropout_state(seed), got "
            f"{type(state).__name__}"
        )
    if p == 0.0:
        return x
    if state.default_update is not None:
        raise ValueError(
            f"dropout: state {state.name or state} already drives a dropout call; give "
            "each dropout its own state (dropout_state(seed + k))"
        )
    if _is_gpu_state(state):
        y, update = seam.backend().dropout(x, p, state)
    else:
        y = Dropout(p)(x, state)
        update = DropoutAdvance()(state, x.size)
    with warnings.catch_warnings():
        # PyTensor 3 deprecates setting default_update (still honoured by
        # pytensor.function in 3.0 and 3.3); it is what makes every compiled
        # step advance the counter without the caller listing the update
        warnings.simplefilter("ignore", DeprecationWarning)
        state.default_update = update
    return y
