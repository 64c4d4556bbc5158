"""Dropout on the CPU: Philox4x32-10 known answers, the bit rule, statistics,
the gradient, the counter update and validation, in every mode."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

import cc2ops
from cc2ops.dropout import (
    Dropout,
    DropoutAdvance,
    advance_state,
    dropout,
    dropout_mask_reference,
    dropout_state,
    keep_threshold,
    philox4x32_reference,
)

# Random123 kat_vectors, philox4x32 with 10 rounds: (counter, key, expected)
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2,
     [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]  # fmt: skip


def philox_scalar(ctr, key):
    """Philox4x32-10 with Python ints, one counter (independent of numpy)."""
    c, (k0, k1) = list(ctr), key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1,
             p0 & 0xFFFFFFFF]  # fmt: skip
    return c


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert philox4x32_reference(ctr, key).tolist() == want
    assert philox_scalar(ctr, key) == want


def test_philox_vectorised_matches_scalar():
    r = np.random.default_rng(0)
    ctrs = r.integers(0, 2**32, (50, 4), dtype=np.uint64)
    keys = r.integers(0, 2**32, (50, 2), dtype=np.uint64)
    got = philox4x32_reference(ctrs, keys)
    for c, k, g in zip(ctrs, keys, got, strict=True):
        assert g.tolist() == philox_scalar([int(v) for v in c], [int(v) for v in k])
    with pytest.raises(ValueError, match=r"counters must have shape \(\.\.\., 4\)"):
        philox4x32_reference(np.zeros(3), [0, 0])


def test_the_bit_rule_element_by_element():
    state = np.array([7, 9, 0xFFFFFFFE, 3], np.uint32)  # counter crosses 2**32
    p, n = 0.4, 23
    mask = dropout_mask_reference(state, n, p)
    base = 0xFFFFFFFE + (3 << 32)
    for i in range(n):
        b = base + i // 4
        word = philox_scalar([b & 0xFFFFFFFF, b >> 32, 0, 0], [7, 9])[i % 4]
        assert mask[i] == (word < int((1 - p) * 2**32)), i
    assert keep_threshold(0.0) == 2**32 and dropout_mask_reference(state, 9, 0.0).all()


def test_advance_state_wraps():
    s = np.array([1, 2, 0xFFFFFFFF, 0xFFFFFFFF], np.uint32)
    assert advance_state(s, 9).tolist() == [1, 2, 2, 0]
    assert advance_state(np.array([1, 2, 5, 0], np.uint32), 8).tolist() == [1, 2, 7, 0]


def test_mask_rate_and_scaling():
    n, p = 400_000, 0.3
    mask = dropout_mask_reference(np.array([11, 0, 0, 0], np.uint32), n, p)
    rate = mask.mean()
    assert abs(rate - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), rate
    # neighbouring words are uncorrelated
    m = mask.astype(np.float64)
    assert abs(np.corrcoef(m[:-1], m[1:])[0, 1]) < 0.01
    state = dropout_state(3)
    x = pt.matrix("x", dtype="float32")
    y = dropout(x, p, state)
    fn = pytensor.function([x], y, mode=cc2ops.mode)
    v = np.random.default_rng(1).uniform(1, 2, (200, 500)).astype("float32")
    got = fn(v)
    kept = got != 0
    np.testing.assert_array_equal(got[kept], v[kept] * np.float32(1 / (1 - p)))
    assert abs(got.mean() / v.mean() - 1) < 0.01


@pytest.mark.parametrize(
    "mode",
    [cc2ops.mode, "FAST_COMPILE", None],
    ids=["CC2OPS", "FAST_COMPILE", "default"],
)
def test_compiled_steps_advance_and_reproduce(mode):
    def run(seed, steps=3):
        state = dropout_state(seed, name="s")
        x = pt.vector("x", dtype="float64")
        y = dropout(x * 2, 0.5, state)
        fn = pytensor.function([x], y, mode=mode)
        outs = [fn(np.ones(10)) for _ in range(steps)]
        return outs, state.get_value()

    outs, final = run(5)
    assert final.tolist() == [5, 0, 9, 0]  # 3 steps of ceil(10 / 4) blocks
    assert not np.array_equal(outs[0], outs[1])
    for k, o in enumerate(outs):
        want = dropout_mask_reference(advance_state([5, 0, 0, 0], 4 * 3 * k), 10, 0.5)
        np.testing.assert_array_equal(o, np.where(want, 4.0, 0.0), err_msg=f"step {k}")
    again, _ = run(5)
    for a, b in zip(outs, again, strict=True):
        np.testing.assert_array_equal(a, b)
    other, _ = run(6)
    assert not np.array_equal(outs[0], other[0])


def test_gradient_uses_the_same_mask():
    state = dropout_state(8)
    x = pt.matrix("x", dtype="float64")
    y = dropout(x, 0.25, state)
    g = pytensor.grad((y * 3).sum(), x)
    fn = pytensor.function([x], [y, g], mode=cc2ops.mode)
    v = np.random.default_rng(2).uniform(1, 2, (7, 9))
    yv, gv = fn(v)
    np.testing.assert_allclose(gv, np.where(yv != 0, 3 / 0.75, 0.0))
    assert state.get_value()[2] == 16  # one advance per call, not per use


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_verify_grad_with_fixed_state(dtype):
    st = pt.constant(np.array([1, 2, 3, 4], np.uint32))
    v = np.random.default_rng(3).standard_normal((5, 6)).astype(dtype)
    tol = dict(abs_tol=1e-6, rel_tol=1e-6) if dtype == "float64" else dict(
        abs_tol=5e-2, rel_tol=5e-2, eps=1e-2)  # fmt: skip
    verify_grad(lambda x: Dropout(0.4)(x, st) ** 2, [v],
                rng=np.random.default_rng(0), **tol)  # fmt: skip


def test_infer_shape_and_ops():
    x = pt.tensor3("x", dtype="float32")
    y = dropout(x, 0.5, dropout_state(1))
    fn = pytensor.function([x], y.shape, mode=cc2ops.mode)
    assert tuple(fn(np.zeros((2, 3, 5), "float32"))) == (2, 3, 5)
    ops = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    assert Dropout not in ops


def test_validation_errors():
    x = pt.matrix(dtype="float32")
    s = dropout_state(0)
    for bad in (1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"dropout: p must satisfy 0 <= p < 1"):
            dropout(x, bad, s)
    with pytest.raises(TypeError, match="dropout: p must be a real number"):
        dropout(x, "half", s)
    with pytest.raises(TypeError, match="made by dropout_state"):
        dropout(x, 0.5, pytensor.shared(np.zeros(4, np.uint32)))
    assert dropout(x, 0.0, s) is x and s.default_update is None
    dropout(x, 0.5, s)
    with pytest.raises(ValueError, match="already drives a dropout call"):
        dropout(x, 0.5, s)
    with pytest.raises(ValueError, match="seed must satisfy 0 <= seed < 2\\*\\*64"):
        dropout_state(-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        dropout_state(1.5)
    with pytest.raises(TypeError, match="Dropout: x must be float32 or float64"):
        Dropout(0.5)(pt.lmatrix(), s)
    with pytest.raises(TypeError, match="state must be the uint32 vector"):
        Dropout(0.5)(x, pt.lvector())
    with pytest.raises(TypeError, match="DropoutAdvance: n must be an integer scalar"):
        DropoutAdvance()(s, pt.dscalar())
    st = dropout_state(2**40 + 5)
    assert st.get_value().tolist() == [5, 256, 0, 0]
    # the default (device=None) state is a host shared variable
    assert isinstance(st.type, pt.TensorType) and st.type.shape == (4,)
    assert isinstance(dropout_state(1, device=None).type, pt.TensorType)
    with pytest.raises(ValueError, match="dropout_state: device must be >= 0"):
        dropout_state(1, device=-2)
