"""cc2ops on the CPU in every PyTensor mode vs PyTorch-CPU (issue 19).

Layers (float32, bc01):

- ``conv1``: B=64, 32 -> 64 channels, 32x32, 5x5, padding 2;
- ``conv2``: B=64, 64 -> 128 channels, 16x16, 3x3, padding 1;
- ``maxpool3s2``: max pool 3/2 of conv1's output, (64, 64, 32, 32) -> 16x16
  (``F.max_pool2d(ceil_mode=True)``, the cc2ops window rule);
- ``cmrnorm5``: cross-map norm size 5 (alpha 1e-4, beta 0.75, k 2) of the
  pooled output, (64, 64, 16, 16) (``torch.nn.LocalResponseNorm``); conv ->
  pool -> norm is the pattern of cuda-convnet2's CIFAR-10 nets;
- ``softmax1000``: softmax cross-entropy of 128 x 1000 logits with integer
  labels, the loss layer of cuda-convnet2's ImageNet net
  (``F.cross_entropy(reduction="none")``).

Each layer is compiled as a PyTensor function, forward (``fwd``: the op's
output) and forward+backward (``fwd+bwd``: the output and the gradients of
``sum(y * gy)`` wrt every float input), in these modes:

``cc2ops``
    ``cc2ops.mode``: ``cvm`` linker, the ops' numpy ``perform``.
``numba``
    PyTensor's default mode (Numba linker) with :mod:`cc2ops.backends.numba`.
``object``
    The same Numba mode with every cc2ops op sent to PyTensor's object-mode
    fallback (``generate_fallback_impl``: the op's ``perform`` called from
    the compiled graph), which is what PyTensor 3 did before this backend.
``jax``
    ``mode="JAX"``, only when jax imports and ``jax_funcify`` has a cc2ops
    registration (``cc2ops/backends/jax.py``); otherwise the rows are skipped
    and the reason printed.

The peer is PyTorch on the CPU with ``torch.set_num_threads(2)``, timed in the
same process (forward under ``no_grad``; forward+backward with autograd).
Every mode's outputs are checked against PyTorch before timing. Times are
medians of wall-clock calls; ``ratio`` is the mode's time over PyTorch's,
timed right before it. Each row records the 1-minute load average
(``load_avg_1min``): on a shared machine the ratios are what to compare.

Run: ``python benchmarks/bench_cpu.py [--quick] [--out DIR]``. The result file
is ``benchmarks/results/cpu-<machine>-<YYYYMMDD>.json``, with a ``cpu`` field
(the processor model) where GPU files have ``gpu``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    base_parser,
    git_commit,
    markdown_table,
)
from cc2ops.testing.compare import rel_err  # noqa: E402

THREADS = 2
MODES = ("cc2ops", "numba", "object", "jax")


def cpu_name() -> str:
    """The processor model from /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_tag(name: str) -> str:
    """Short lowercase file-name tag: "AMD EPYC 9654 96-Core" -> "amd-epyc-9654"."""
    words = [w for w in name.lower().replace("(r)", "").replace("(tm)", "").split()]
    keep = [w for w in words if "core" not in w and w not in ("processor", "cpu")]
    return "-".join(keep[:3]) or "cpu"


def blocking(mode: str, fn: Callable[..., Any], vals: list) -> Callable[[], Any]:
    """A call of ``fn(*vals)`` that returns once its results are computed.

    JAX dispatches asynchronously: a JAX-mode function returns device arrays
    whose values may still be in flight, so its call is followed by
    ``jax.block_until_ready`` (timing the dispatch alone reads as 0.02 ms).
    The other modes return numpy arrays, computed.
    """
    if mode != "jax":
        return lambda: fn(*vals)
    import jax

    return lambda: jax.block_until_ready(fn(*vals))


def time_call(fn: Callable[[], Any], *, warmup: int, iters: int) -> float:
    """Median wall-clock milliseconds of ``fn()`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


# --------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------


def _cc2ops_op_classes() -> list[type]:
    import cc2ops

    return [
        getattr(cc2ops, n)
        for n in cc2ops.__all__
        if isinstance(getattr(cc2ops, n), type)
    ] + [
        __import__("cc2ops.dropout", fromlist=["Dropout"]).Dropout,
        __import__("cc2ops.dropout", fromlist=["DropoutAdvance"]).DropoutAdvance,
    ]


@contextlib.contextmanager
def object_mode_dispatch() -> Iterator[None]:
    """Compile with every cc2ops op on PyTensor's object-mode fallback.

    Registers ``generate_fallback_impl`` for the cc2ops op classes on both of
    PyTensor's Numba dispatchers and restores the backend's registrations on
    exit (functions compiled inside keep the fallback).
    """
    from pytensor.link.numba.dispatch import basic

    import cc2ops.backends.numba  # noqa: F401  (its registrations, to restore)

    classes = _cc2ops_op_classes()
    saved = {
        d: {c: d.registry.get(c) for c in classes}
        for d in (basic.numba_funcify, basic.numba_funcify_and_cache_key)
    }

    def fallback(op, node=None, **kwargs):
        return basic.generate_fallback_impl(op, node, **kwargs)

    def fallback_key(op, node=None, **kwargs):
        return basic.generate_fallback_impl(op, node, **kwargs), None

    for c in classes:
        basic.numba_funcify.register(c, fallback)
        basic.numba_funcify_and_cache_key.register(c, fallback_key)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Numba will use object mode")
            yield
    finally:
        for d, regs in saved.items():
            for c, f in regs.items():
                # classes registered through numba_funcify_default_op_cache_key
                # have no entry of their own here: the base case serves them
                d.register(c, d.registry[object] if f is None else f)


def jax_skip_reason() -> str | None:
    """Why JAX rows cannot run here, or ``None`` when they can."""
    try:
        import jax  # noqa: F401
    except ImportError as e:
        return f"jax does not import: {e}"
    from pytensor.link.jax.dispatch import jax_funcify

    import cc2ops

    if cc2ops.FilterActs not in jax_funcify.registry:
        return "jax_funcify has no cc2ops registration (no cc2ops/backends/jax.py)"
    return None


def compile_in(mode: str, inputs, outputs):
    import pytensor

    import cc2ops

    if mode == "cc2ops":
        return pytensor.function(inputs, outputs, mode=cc2ops.mode)
    if mode == "numba":
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Numba will use object mode")
            return pytensor.function(inputs, outputs, mode="NUMBA")
    if mode == "object":
        with object_mode_dispatch():
            return pytensor.function(inputs, outputs, mode="NUMBA")
    if mode == "jax":
        return pytensor.function(inputs, outputs, mode="JAX")
    raise ValueError(f"bench_cpu: unknown mode {mode!r}")


# --------------------------------------------------------------------------
# layers: (name, batch, graph builder, input values, torch fwd, torch fwd+bwd)
# --------------------------------------------------------------------------


def _layers(rng: np.random.Generator, quick: bool) -> list[dict[str, Any]]:
    import pytensor
    import pytensor.tensor as pt
    import torch
    import torch.nn.functional as F

    import cc2ops

    def f32(*shape):
        return rng.standard_normal(shape).astype("float32")

    out = []
    for name, (b, c, f, hw, k, pad) in {
        "conv1": (64, 32, 64, 32, 5, 2),
        "conv2": (64, 64, 128, 16, 3, 1),
    }.items():
        if quick:
            b = 8
        x, w, gy = pt.tensor4("x"), pt.tensor4("w"), pt.tensor4("gy")
        x, w, gy = (v.astype("float32") for v in (x, w, gy))
        xs = pt.tensor4("x", dtype="float32")
        ws = pt.tensor4("w", dtype="float32")
        gys = pt.tensor4("gy", dtype="float32")
        y = cc2ops.conv2d(xs, ws, padding=pad)
        grads = pytensor.grad((y * gys).sum(), [xs, ws])
        vals = [f32(b, c, hw, hw), 0.1 * f32(f, c, k, k), f32(b, f, hw, hw)]
        tx, tw, tg = (torch.from_numpy(v) for v in vals)

        def t_fwd(tx=tx, tw=tw, pad=pad):
            with torch.no_grad():
                return [F.conv2d(tx, tw, padding=pad)]

        def t_fb(tx=tx, tw=tw, tg=tg, pad=pad):
            a = tx.clone().requires_grad_()
            ww = tw.clone().requires_grad_()
            yy = F.conv2d(a, ww, padding=pad)
            yy.backward(tg)
            return [yy.detach(), a.grad, ww.grad]

        flops = 2 * b * f * hw * hw * c * k * k
        out.append(
            dict(
                name=name,
                batch=b,
                fwd=([xs, ws], [y], vals[:2]),
                fb=([xs, ws, gys], [y, *grads], vals),
                torch_fwd=t_fwd,
                torch_fb=t_fb,
                flops={"fwd": flops, "fwd+bwd": 3 * flops},
            )
        )

    b = 8 if quick else 64
    x = pt.tensor4("x", dtype="float32")
    gy = pt.tensor4("gy", dtype="float32")
    y = cc2ops.max_pool2d(x, 3, stride=2)
    gx = pytensor.grad((y * gy).sum(), x)
    vals = [f32(b, 64, 32, 32), f32(b, 64, 16, 16)]
    tx, tg = (torch.from_numpy(v) for v in vals)

    def mp_fwd(tx=tx):
        with torch.no_grad():
            return [F.max_pool2d(tx, 3, 2, ceil_mode=True)]

    def mp_fb(tx=tx, tg=tg):
        a = tx.clone().requires_grad_()
        yy = F.max_pool2d(a, 3, 2, ceil_mode=True)
        yy.backward(tg)
        return [yy.detach(), a.grad]

    out.append(
        dict(
            name="maxpool3s2",
            batch=b,
            fwd=([x], [y], vals[:1]),
            fb=([x, gy], [y, gx], vals),
            torch_fwd=mp_fwd,
            torch_fb=mp_fb,
        )
    )

    x = pt.tensor4("x", dtype="float32")
    gy = pt.tensor4("gy", dtype="float32")
    y = cc2ops.cross_map_norm(x, size=5, alpha=1e-4, beta=0.75, k=2.0)
    gx = pytensor.grad((y * gy).sum(), x)
    vals = [f32(b, 64, 16, 16), f32(b, 64, 16, 16)]
    tx, tg = (torch.from_numpy(v) for v in vals)
    lrn = torch.nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0)

    def n_fwd(tx=tx):
        with torch.no_grad():
            return [lrn(tx)]

    def n_fb(tx=tx, tg=tg):
        a = tx.clone().requires_grad_()
        yy = lrn(a)
        yy.backward(tg)
        return [yy.detach(), a.grad]

    out.append(
        dict(
            name="cmrnorm5",
            batch=b,
            fwd=([x], [y], vals[:1]),
            fb=([x, gy], [y, gx], vals),
            torch_fwd=n_fwd,
            torch_fb=n_fb,
        )
    )

    bs = 16 if quick else 128
    x = pt.matrix("x", dtype="float32")
    lab = pt.ivector("y")
    g = pt.vector("g", dtype="float32")
    loss = cc2ops.softmax_cross_entropy(x, lab)
    gx = pytensor.grad((loss * g).sum(), x)
    vals = [3 * f32(bs, 1000), rng.integers(0, 1000, bs).astype("int32"), f32(bs)]
    tx = torch.from_numpy(vals[0])
    ty = torch.from_numpy(vals[1].astype("int64"))
    tg = torch.from_numpy(vals[2])

    def s_fwd(tx=tx, ty=ty):
        with torch.no_grad():
            return [F.cross_entropy(tx, ty, reduction="none")]

    def s_fb(tx=tx, ty=ty, tg=tg):
        a = tx.clone().requires_grad_()
        ll = F.cross_entropy(a, ty, reduction="none")
        ll.backward(tg)
        return [ll.detach(), a.grad]

    out.append(
        dict(
            name="softmax1000",
            batch=bs,
            fwd=([x, lab], [loss], vals[:2]),
            fb=([x, lab, g], [loss, gx], vals),
            torch_fwd=s_fwd,
            torch_fb=s_fb,
        )
    )
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset of {MODES}",
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    iters = 5 if args.quick else args.iters
    warmup = 1 if args.quick else args.warmup
    modes = [m for m in args.modes.split(",") if m]
    skip = jax_skip_reason() if "jax" in modes else None
    if skip is not None:
        print(f"skipping the JAX rows: {skip}")
        modes.remove("jax")
    rows = []
    for layer in _layers(rng, args.quick):
        for pas, key, tfn in (
            ("fwd", "fwd", layer["torch_fwd"]),
            ("fwd+bwd", "fb", layer["torch_fb"]),
        ):
            inputs, outputs, vals = layer[key]
            want = [t.numpy() for t in tfn()]
            for mode in modes:
                t0 = time.perf_counter()
                fn = compile_in(mode, inputs, outputs)
                got = fn(*vals)
                compile_s = time.perf_counter() - t0
                errs = [rel_err(a, b) for a, b in zip(got, want, strict=True)]
                if not max(errs) <= 1e-4:
                    raise SystemExit(
                        f"{layer['name']} {pas} {mode}: outputs differ from torch "
                        f"(relative errors {errs})"
                    )
                # the peer is timed right before each mode, so that both see the
                # same machine load (a shared machine's load drifts)
                peer_ms = time_call(tfn, warmup=warmup, iters=iters)
                ms = time_call(blocking(mode, fn, vals), warmup=warmup, iters=iters)
                row = {
                    "name": layer["name"],
                    "batch": layer["batch"],
                    "pass": pas,
                    "precision": "fp32",
                    "mode": mode,
                    "cc2ops_ms": ms,
                    "peer_ms": peer_ms,
                    "ratio": ms / peer_ms,
                    "max_rel_err": max(errs),
                    "first_call_s": compile_s,
                    "load_avg_1min": os.getloadavg()[0],
                }
                if "flops" in layer:
                    row["gflops"] = layer["flops"][pas] / (ms * 1e-3) / 1e9
                    row["peer_gflops"] = layer["flops"][pas] / (peer_ms * 1e-3) / 1e9
                rows.append(row)
                print(
                    f"{layer['name']:12s} {pas:8s} {mode:7s} {ms:9.3f} ms   torch "
                    f"{peer_ms:9.3f} ms   ratio {ms / peer_ms:6.2f}",
                    flush=True,
                )
    return write_cpu_results(rows, args.out, skip)


def write_cpu_results(rows: list[dict], out_dir: Path, jax_skip: str | None) -> Path:
    """``<out_dir>/cpu-<machine>-<YYYYMMDD>.json`` in the results format."""
    import numba
    import pytensor
    import torch

    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = float(f"{v:.6g}")
    name = cpu_name()
    today = _dt.date.today()
    doc = {
        "benchmark": "cpu",
        "cpu": name,
        "cores": os.cpu_count(),
        "date": today.isoformat(),
        "commit": git_commit(),
        "peer": f"torch {torch.__version__} (CPU, {THREADS} threads)",
        "versions": {
            "pytensor": pytensor.__version__,
            "numba": numba.__version__,
            "numpy": np.__version__,
        },
        "rows": rows,
    }
    if jax_skip is not None:
        doc["jax_skipped"] = jax_skip
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"cpu-{cpu_tag(name)}-{today:%Y%m%d}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        markdown_table(
            rows, ["name", "batch", "pass", "mode", "cc2ops_ms", "peer_ms", "ratio"]
        )
    )
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
