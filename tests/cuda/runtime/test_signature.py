"""Kernels declare their arguments: the signatures read from rendered sources,
and the check launch makes against them (CPU: no device needed)."""

from __future__ import annotations

import numpy as np
import pytest

import cc2ops.cuda  # noqa: F401  (registers every kernel family's variants)
from cc2ops.cuda.runtime.compile import all_variants, render
from cc2ops.cuda.runtime.signature import check_arguments, kernel_signatures

pytest.importorskip("mako")


def test_every_registered_variant_declares_its_kernels():
    seen = 0
    for family, consts in all_variants():
        sigs = kernel_signatures(render(family, **consts))
        assert sigs, f'{family} {consts}: no extern "C" __global__ kernel'
        if "name" in consts:
            assert consts["name"] in sigs, f"{family}: no kernel {consts['name']}"
        for kernel, params in sigs.items():
            unknown = [p.decl for p in params if p.kind is None]
            assert unknown == [], f"{family} {kernel}: unparsed types {unknown}"
            seen += 1
    assert seen > 50


def test_fill_kernel_signature_and_the_checks():
    (params,) = kernel_signatures(render("fill", name="fill_u4", unit=4)).values()
    assert [p.name for p in params] == ["dst", "n", "p0", "p1", "period"]
    assert [(p.kind, p.size) for p in params] == [
        ("p", 8), ("i", 8), ("u", 8), ("u", 8), ("i", 8),
    ]  # fmt: skip
    ok = [np.uintp, np.int64, np.uint64, np.uint64, np.int64]
    check_arguments("fill_u4", params, ok)
    # same width, other signedness: the same value for every index
    check_arguments("fill_u4", params, [np.uintp, np.uint64, *ok[2:]])
    with pytest.raises(
        TypeError,
        match=r"launch: kernel fill_u4 argument 1 \(n\) is index_t in the kernel, "
        r"got uint32",
    ):
        check_arguments("fill_u4", params, [np.uintp, np.uint32, *ok[2:]])
    with pytest.raises(
        TypeError, match=r"argument 4 \(period\) is index_t in the kernel, got float64"
    ):
        check_arguments("fill_u4", params, [*ok[:4], np.float64])
    with pytest.raises(
        TypeError,
        match=r"argument 0 \(dst\) is u32\* __restrict__ in the kernel, got int32",
    ):
        check_arguments("fill_u4", params, [np.int32, *ok[1:]])
    with pytest.raises(
        TypeError,
        match=r"kernel fill_u4 takes 5 arguments \(dst, n, p0, p1, period\), got 4",
    ):
        check_arguments("fill_u4", params, ok[:4])


def test_parser_resolves_typedefs_bounds_comments_and_structs():
    source = """
    typedef unsigned int u32;
    typedef u32 index32;          // a chain
    typedef float* fptr;
    struct Box { int a; };
    /* extern "C" __global__ void commented_out(double x) */
    extern "C" __global__ void __launch_bounds__(256, 2) k(
        const float* __restrict__ x,   // input
        fptr y,
        index32 n,
        Box box,
        const double scale)
    {}
    extern "C" __global__ void empty(void);
    """
    sigs = kernel_signatures(source)
    assert set(sigs) == {"k", "empty"}
    assert sigs["empty"] == ()
    kinds = [(p.name, p.kind, p.size) for p in sigs["k"]]
    assert kinds == [
        ("x", "p", 8), ("y", "p", 8), ("n", "u", 4), ("box", None, 0),
        ("scale", "f", 8),
    ]  # fmt: skip
    # a struct passed by value is not checked; everything else is
    check_arguments(
        "k", sigs["k"], [np.uintp, np.uintp, np.int32, np.int64, np.float64]
    )
    with pytest.raises(TypeError, match=r"argument 4 \(scale\) is const double"):
        check_arguments(
            "k", sigs["k"], [np.uintp, np.uintp, np.uint32, np.int64, np.float32]
        )
