"""Convolution benchmark: cc2ops GPU convolution vs PyTorch/cuDNN on AlexNet layers.

The five convolution layers of AlexNet (one-tower, 64-192-384-256-256
filters) at batch 128, 32 and 100 (``--quick``: 128 only), each pass
(``fwd``, ``bwd_data``, ``bwd_filter``) and their sum (``fwd+bwd``), in fp32
and TF32.

What is timed
-------------
cc2ops: the plain pass functions of :mod:`cc2ops.cuda.ops.conv.ops`
(``filter_acts``, ``image_acts`` and ``weight_acts``)
on pycuda GPUArrays (what the ops' ``perform`` runs, without PyTensor's graph
overhead). The first call of each geometry autotunes (before the warm-up
ends); the row names the chosen algorithm. Peer:
``torch.nn.functional.conv2d`` and ``torch.ops.aten.convolution_backward``
(only the needed gradient) with ``torch.backends.cudnn.benchmark = True``;
fp32 rows set ``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32`` to False, tf32 rows to True.

Both libraries are timed twice: replayed as a CUDA graph (``time_graph``:
the kernels' device time without launch cost, captured the same way for
both; ``cc2ops_ms``, ``peer_ms``, ``ratio``, ``tflops``) and called eagerly
(``time_cuda``: host launch cost included; ``cc2ops_eager_ms``,
``peer_eager_ms``).

Each pass is checked before it is timed: cc2ops's result must match the
same pass computed by torch in float64 (rows record both libraries' errors
against it).

Run: ``python benchmarks/bench_conv.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    base_parser,
    time_cuda,
    time_graph,
    torch_peer,
    write_results,
)
from cc2ops.shapes import conv_flops  # noqa: E402
from cc2ops.testing.compare import rel_err  # noqa: E402

#: (name, channels, filters, image size, filter size, stride, padding)
LAYERS = [
    ("conv1", 3, 64, 224, 11, 4, 0),
    ("conv2", 64, 192, 27, 5, 1, 2),
    ("conv3", 192, 384, 13, 3, 1, 1),
    ("conv4", 384, 256, 13, 3, 1, 1),
    ("conv5", 256, 256, 13, 3, 1, 1),
]
BATCHES = (128, 32, 100)
PRECISIONS = ("fp32", "tf32")
PASSES = ("fwd", "bwd_data", "bwd_filter")
#: Largest relative-norm difference from torch accepted before timing.
CHECK_TOL = {"fp32": 1e-4, "tf32": 1e-2}
_OP = {"fwd": "filter_acts", "bwd_data": "image_acts", "bwd_filter": "weight_acts"}


def _torch_settings(precision: str) -> None:
    import torch

    torch.backends.cudnn.benchmark = True
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _torch_pass(name: str, x: Any, w: Any, dy: Any, s: int, p: int) -> Any:
    import torch

    if name == "fwd":
        return lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p)
    mask = [name == "bwd_data", name == "bwd_filter", False]
    idx = 0 if name == "bwd_data" else 1

    def run() -> Any:
        return torch.ops.aten.convolution_backward(
            dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask
        )[idx]

    return run


def _cc2ops_pass(
    name: str, gx: Any, gw: Any, gdy: Any, s: int, p: int, precision: str
) -> Any:
    from cc2ops.cuda.ops.conv import ops as conv

    params = dict(stride=s, padding=p, precision=precision, device=0)
    hw = tuple(int(v) for v in gx.shape[2:])
    khw = tuple(int(v) for v in gw.shape[2:])
    if name == "fwd":
        out = conv.filter_acts(gx, gw, **params)
        return lambda: conv.filter_acts(gx, gw, **params, out=out)
    if name == "bwd_data":
        return lambda: conv.image_acts(gdy, gw, hw, **params)
    return lambda: conv.weight_acts(gx, gdy, khw, **params)


def run_layer(
    layer: tuple, batch: int, precision: str, warmup: int, iters: int
) -> list[dict[str, Any]]:
    """The rows of one layer, batch and precision (after the correctness check)."""
    import torch

    from cc2ops.cuda.ops.conv import ops as conv
    from cc2ops.cuda.runtime import array

    name, c, f, hw, k, s, p = layer
    _torch_settings(precision)
    r = np.random.default_rng(0)
    ho = (hw + 2 * p - k) // s + 1
    x = r.standard_normal((batch, c, hw, hw)).astype(np.float32)
    w = (r.standard_normal((f, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    dy = r.standard_normal((batch, f, ho, ho)).astype(np.float32)
    tx, tw, tdy = (torch.from_numpy(a).cuda() for a in (x, w, dy))
    # the correctness reference: the same pass in float64 (cuDNN's fp32 choices
    # under cudnn.benchmark include Winograd/FFT, whose error is not fp32's)
    tx64, tw64, tdy64 = (t.double() for t in (tx, tw, tdy))
    gx, gw, gdy = (array.to_gpu(a, 0) for a in (x, w, dy))
    geometry = conv.geometry_of(name, x.shape, w.shape, (s, s), (p, p), 1)
    flops = conv_flops(batch, c, f, (ho, ho), (k, k))
    rows = []
    totals = {"cc2ops_ms": 0.0, "peer_ms": 0.0, "cc2ops_eager_ms": 0.0,
              "peer_eager_ms": 0.0}  # fmt: skip
    for pas in PASSES:
        peer_fn = _torch_pass(pas, tx, tw, tdy, s, p)
        ours_fn = _cc2ops_pass(pas, gx, gw, gdy, s, p, precision)  # tunes here
        want64 = _torch_pass(pas, tx64, tw64, tdy64, s, p)().cpu().numpy()
        peer_err = rel_err(peer_fn().float().cpu().numpy(), want64)
        got = array.to_host(ours_fn())
        err = rel_err(got, want64)
        if not err <= CHECK_TOL[precision]:
            raise AssertionError(
                f"bench_conv: {name} b{batch} {pas} {precision}: cc2ops differs "
                f"from the float64 result by {err:.3g} (tolerance "
                f"{CHECK_TOL[precision]}; torch's own error {peer_err:.3g})"
            )
        ours = time_graph(ours_fn, warmup=warmup, iters=iters, on="cc2ops")
        peer = time_graph(peer_fn, warmup=warmup, iters=iters, on="torch")
        ours_eager = time_cuda(ours_fn, warmup=warmup, iters=iters, on="cc2ops")
        peer_eager = time_cuda(peer_fn, warmup=warmup, iters=iters, on="torch")
        totals["cc2ops_ms"] += ours
        totals["peer_ms"] += peer
        totals["cc2ops_eager_ms"] += ours_eager
        totals["peer_eager_ms"] += peer_eager
        rows.append(
            {
                "name": name,
                "batch": batch,
                "pass": pas,
                "precision": precision,
                "cc2ops_ms": ours,
                "peer_ms": peer,
                "ratio": ours / peer,
                "tflops": flops / ours / 1e9,
                "peer_tflops": flops / peer / 1e9,
                "algorithm": conv.chosen_algorithm(
                    _OP[pas], geometry, np.float32, precision
                ),
                "rel_err_vs_fp64": err,
                "peer_rel_err_vs_fp64": peer_err,
                "cc2ops_eager_ms": ours_eager,
                "peer_eager_ms": peer_eager,
            }
        )
    rows.append(
        {
            "name": name,
            "batch": batch,
            "pass": "fwd+bwd",
            "precision": precision,
            **totals,
            "ratio": totals["cc2ops_ms"] / totals["peer_ms"],
            "tflops": 3 * flops / totals["cc2ops_ms"] / 1e9,
            "peer_tflops": 3 * flops / totals["peer_ms"] / 1e9,
            "algorithm": "+".join(r["algorithm"] for r in rows),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> Path:
    """Run the benchmark; returns the result file's path.

    A layer whose correctness check or run fails is reported (``failures`` in
    the result file) and the others still run, so one run always leaves a
    result file.
    """
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--layers",
        default=",".join(layer[0] for layer in LAYERS),
        help="comma-separated subset of conv1..conv5",
    )
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="fp32, tf32 or both"
    )
    args = parser.parse_args(argv)
    import cc2ops.cuda as cuda

    cuda.require()
    wanted = set(args.layers.split(","))
    unknown = wanted - {layer[0] for layer in LAYERS}
    if unknown:
        parser.error(f"--layers: unknown layers {sorted(unknown)}")
    precisions = [p for p in PRECISIONS if p in args.precisions.split(",")]
    batches = (128,) if args.quick else BATCHES
    iters = min(args.iters, 10) if args.quick else args.iters
    rows: list[dict[str, Any]] = []
    failures: list[str] = []

    def save() -> Path:
        # rewritten after every layer: a run cut short still leaves its rows
        return write_results(
            "conv",
            rows,
            torch_peer(),
            args.out,
            extra={
                "timing": (
                    "cc2ops_ms/peer_ms: CUDA-graph replays of each pass (device "
                    "time, both libraries captured alike); *_eager_ms: eager calls; "
                    "cc2ops: cc2ops.cuda.ops.conv.ops pass functions on GPUArrays; "
                    "medians"
                ),
                "cudnn_benchmark": True,
                "failures": failures,
            },
        )

    for batch in batches:
        for precision in precisions:
            for layer in LAYERS:
                if layer[0] not in wanted:
                    continue
                try:
                    rows.extend(run_layer(layer, batch, precision, args.warmup, iters))
                except Exception as e:  # report it, keep measuring the others
                    msg = f"{layer[0]} b{batch} {precision}: {type(e).__name__}: {e}"
                    print(f"bench_conv: FAILED {msg}", flush=True)
                    failures.append(msg)
                save()
    return save()


if __name__ == "__main__":
    main()
