"""Pooling, cross-map normalisation and softmax cross-entropy vs PyTorch (batch 128).

Layers (AlexNet sizes, float32, bc01):

- max pool 3/2 and avg pool 3/2 on 64x54x54 and 192x27x27, against
  ``F.max_pool2d`` / ``F.avg_pool2d`` with ``ceil_mode=True`` (the cc2ops
  window rule; outputs are compared first, max pool exactly);
- cross-map norm size 5 (alpha 1e-4, beta 0.75, k 2) on the same sizes,
  against ``torch.nn.LocalResponseNorm(5, 1e-4, 0.75, 2)`` (torch divides
  alpha by size, as cc2ops does: the same parameters);
- softmax cross-entropy 128x1000 and 128x21841 (integer labels), against
  ``F.cross_entropy(reduction="none")``.

Each is timed forward and forward+backward, twice per library: replayed as a
CUDA graph (``time_graph``: the kernels' device time without launch cost,
captured the same way for both libraries, ``--repeat`` calls back to back per
replay and the time per call reported, as kernels follow each other in a
training step; these are ``cc2ops_ms``, ``peer_ms``, the bandwidth columns
and ``ratio``; ``kernel_floor_ms`` is a one-float kernel timed the same way,
the least any kernel takes) and called eagerly
(``time_cuda``: host launch cost included; ``cc2ops_eager_ms``,
``peer_eager_ms``). cc2ops runs on its own stream through the module-level
launch functions on GPUArrays, torch on its stream. Rows report ms, GB/s of
the minimum bytes (every input read once, every output written once), the
fraction of the H200's 4.19 TB/s copy ceiling and the ratio cc2ops/torch.
The softmax launches skip the per-call label check (``check=False``; the
check, a 4-byte synchronising read, runs once during the correctness pass).

Run: ``python benchmarks/bench_layers.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    COPY_CEILING_GBPS,
    base_parser,
    time_cuda,
    time_graph,
    torch_peer,
    write_results,
)
from cc2ops.testing.compare import rel_err  # noqa: E402

BATCH = 128


def _bytes(*arrays_or_counts: Any) -> int:
    total = 0
    for a in arrays_or_counts:
        total += int(a) if isinstance(a, (int, np.integer)) else int(a.nbytes)
    return total


def _row(name: str, pas: str, cc: tuple, peer: tuple, nbytes: int) -> dict:
    """A result row from (graph, eager) milliseconds of both libraries."""
    cc_ms, peer_ms = cc[0], peer[0]
    gbps = nbytes / (cc_ms * 1e-3) / 1e9
    return {
        "name": name,
        "batch": BATCH,
        "pass": pas,
        "precision": "fp32",
        "cc2ops_ms": cc_ms,
        "peer_ms": peer_ms,
        "ratio": cc_ms / peer_ms,
        "min_bytes": nbytes,
        "cc2ops_gbps": gbps,
        "frac_copy_ceiling": gbps / COPY_CEILING_GBPS,
        "peer_gbps": nbytes / (peer_ms * 1e-3) / 1e9,
        "cc2ops_eager_ms": cc[1],
        "peer_eager_ms": peer[1],
    }


def _check(name: str, got: Any, want: Any, tol: float) -> None:
    err = rel_err(got, want)
    if not err <= tol:
        raise SystemExit(f"{name}: cc2ops and torch differ (relative error {err:.3g})")
    print(f"ok {name}: relative error vs torch {err:.2e}")


def main(argv: list[str] | None = None) -> Path:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=10,
        help="calls captured back to back per graph replay (time per call reported)",
    )
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from cc2ops.cuda.ops import cross_map_norm as grn
    from cc2ops.cuda.ops import pool as gpool
    from cc2ops.cuda.ops import softmax_cross_entropy as gsl
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    dev.activate()
    torch.backends.cudnn.benchmark = True
    timing = dict(warmup=args.warmup, iters=5 if args.quick else args.iters)

    def cc(fn):
        return (
            time_graph(fn, on="cc2ops", device=0, repeat=args.repeat, **timing),
            time_cuda(fn, on="cc2ops", device=0, **timing),
        )

    def th(fn):
        return (
            time_graph(fn, on="torch", repeat=args.repeat, **timing),
            time_cuda(fn, on="torch", **timing),
        )

    # the device time of a kernel that moves 4 bytes, timed the same way: no
    # kernel is faster, whatever its size
    one = torch.zeros(1, device="cuda")
    floor_ms = time_graph(one.zero_, on="torch", repeat=args.repeat, **timing)
    print(f"kernel floor (torch zero_ of one float): {floor_ms * 1e3:.2f} us")

    rng = np.random.default_rng(0)
    rows: list[dict] = []
    failures: list[str] = []
    images = [(64, 54)] if args.quick else [(64, 54), (192, 27)]
    p = dict(size=5, alpha=1e-4, beta=0.75, k=2.0)
    lrn = torch.nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0)

    for c, hw in images:
        try:
            x = rng.standard_normal((BATCH, c, hw, hw)).astype(np.float32)
            gx_dev = array.to_gpu(x, 0)
            tx = torch.from_numpy(x).cuda()
            tag = f"{c}x{hw}^2"

            # ---------------- max pool 3/2 ----------------
            y = gpool.max_pool_forward(gx_dev, 3, 2)
            ty = F.max_pool2d(tx, 3, 2, ceil_mode=True)
            yh = array.to_host(y)
            if yh.shape != tuple(ty.shape) or not np.array_equal(yh, ty.cpu().numpy()):
                raise SystemExit(f"max pool {tag}: outputs differ from torch ceil_mode")
            print(f"ok max pool {tag}: identical to torch ceil_mode=True {yh.shape}")
            gy = rng.standard_normal(yh.shape).astype(np.float32)
            ggy, tgy = array.to_gpu(gy, 0), torch.from_numpy(gy).cuda()
            txr = tx.clone().requires_grad_(True)
            F.max_pool2d(txr, 3, 2, ceil_mode=True).backward(tgy)
            got = array.to_host(gpool.max_pool_grad(gx_dev, y, ggy, 3, 2))
            _check(f"max pool grad {tag}", got, txr.grad.cpu().numpy(), 1e-6)

            def cc_max_fb(x=gx_dev, g=ggy):
                out = gpool.max_pool_forward(x, 3, 2)
                gpool.max_pool_grad(x, out, g, 3, 2)

            def th_max_fb(x=txr, g=tgy):
                x.grad = None
                F.max_pool2d(x, 3, 2, ceil_mode=True).backward(g)

            fwd_b = _bytes(x, yh)
            bwd_b = _bytes(x, yh, gy, x)
            rows.append(_row(
                f"max_pool 3/2 {tag}", "fwd",
                cc(lambda x=gx_dev: gpool.max_pool_forward(x, 3, 2)),
                th(lambda x=tx: F.max_pool2d(x, 3, 2, ceil_mode=True)), fwd_b,
            ))  # fmt: skip
            rows.append(_row(
                f"max_pool 3/2 {tag}", "fwd+bwd", cc(cc_max_fb), th(th_max_fb),
                fwd_b + bwd_b,
            ))  # fmt: skip

            # ---------------- avg pool 3/2 ----------------
            a = array.to_host(gpool.avg_pool_forward(gx_dev, 3, 2))
            ta = F.avg_pool2d(tx, 3, 2, ceil_mode=True)
            _check(f"avg pool {tag}", a, ta.cpu().numpy(), 1e-6)
            txr.grad = None
            F.avg_pool2d(txr, 3, 2, ceil_mode=True).backward(tgy)
            got = array.to_host(gpool.avg_pool_grad(ggy, (hw, hw), 3, 2))
            _check(f"avg pool grad {tag}", got, txr.grad.cpu().numpy(), 1e-6)

            def cc_avg_fb(x=gx_dev, g=ggy, hw=hw):
                gpool.avg_pool_forward(x, 3, 2)
                gpool.avg_pool_grad(g, (hw, hw), 3, 2)

            def th_avg_fb(x=txr, g=tgy):
                x.grad = None
                F.avg_pool2d(x, 3, 2, ceil_mode=True).backward(g)

            rows.append(_row(
                f"avg_pool 3/2 {tag}", "fwd",
                cc(lambda x=gx_dev: gpool.avg_pool_forward(x, 3, 2)),
                th(lambda x=tx: F.avg_pool2d(x, 3, 2, ceil_mode=True)), fwd_b,
            ))  # fmt: skip
            rows.append(_row(
                f"avg_pool 3/2 {tag}", "fwd+bwd", cc(cc_avg_fb), th(th_avg_fb),
                fwd_b + _bytes(gy, x),
            ))  # fmt: skip

            # ---------------- cross-map norm 5 ----------------
            # larger inputs make the window sums matter for the comparison
            x3 = (30 * x).astype(np.float32)
            g3 = array.to_gpu(x3, 0)
            t3 = torch.from_numpy(x3).cuda()
            yn = array.to_host(grn.cross_map_norm_forward(g3, **p))
            _check(f"cross-map norm {tag}", yn, lrn(t3).cpu().numpy(), 1e-5)
            gn = rng.standard_normal(x.shape).astype(np.float32)
            ggn, tgn = array.to_gpu(gn, 0), torch.from_numpy(gn).cuda()
            t3r = t3.clone().requires_grad_(True)
            lrn(t3r).backward(tgn)
            got = array.to_host(grn.cross_map_norm_grad(g3, ggn, **p))
            _check(f"cross-map norm grad {tag}", got, t3r.grad.cpu().numpy(), 1e-4)

            def cc_lrn_fb(x=g3, g=ggn, p=p):
                grn.cross_map_norm_forward(x, **p)
                grn.cross_map_norm_grad(x, g, **p)

            def th_lrn_fb(x=t3r, g=tgn, lrn=lrn):
                x.grad = None
                lrn(x).backward(g)

            rows.append(_row(
                f"cross_map_norm 5 {tag}", "fwd",
                cc(lambda x=g3, p=p: grn.cross_map_norm_forward(x, **p)),
                th(lambda x=t3, lrn=lrn: lrn(x)), _bytes(x, x),
            ))  # fmt: skip
            rows.append(_row(
                f"cross_map_norm 5 {tag}", "fwd+bwd", cc(cc_lrn_fb), th(th_lrn_fb),
                _bytes(x, x) + _bytes(x, x, x),
            ))  # fmt: skip
            del gx_dev, g3, ggn, ggy
        except Exception as e:  # report it, keep measuring the others
            msg = f"{c}x{hw}^2: {type(e).__name__}: {e}"
            print(f"bench_layers: FAILED {msg}", flush=True)
            failures.append(msg)

    # ---------------- softmax cross-entropy ----------------
    for k in [1000] if args.quick else [1000, 21841]:
        try:
            logits = (3 * rng.standard_normal((BATCH, k))).astype(np.float32)
            labels = rng.integers(0, k, BATCH).astype(np.int64)
            gl, gyl = array.to_gpu(logits, 0), array.to_gpu(labels, 0)
            tl, tyl = torch.from_numpy(logits).cuda(), torch.from_numpy(labels).cuda()
            loss = array.to_host(gsl.softmax_cross_entropy_forward(gl, gyl))
            tloss = F.cross_entropy(tl, tyl, reduction="none")
            _check(f"softmax xent K={k}", loss, tloss.cpu().numpy(), 1e-5)
            g = np.ones(BATCH, np.float32)
            gg, tg = array.to_gpu(g, 0), torch.from_numpy(g).cuda()
            tlr = tl.clone().requires_grad_(True)
            F.cross_entropy(tlr, tyl, reduction="none").backward(tg)
            got = array.to_host(gsl.softmax_cross_entropy_grad(gg, gl, gyl))
            _check(f"softmax xent grad K={k}", got, tlr.grad.cpu().numpy(), 1e-5)

            flag = gsl.new_label_flag(0)

            def cc_sm(x=gl, y=gyl, f=flag):
                gsl.softmax_cross_entropy_forward(x, y, check=False, flag=f)

            def cc_sm_fb(x=gl, y=gyl, g=gg, f=flag):
                gsl.softmax_cross_entropy_forward(x, y, check=False, flag=f)
                gsl.softmax_cross_entropy_grad(g, x, y, check=False, flag=f)

            def th_sm_fb(x=tlr, y=tyl, g=tg):
                x.grad = None
                F.cross_entropy(x, y, reduction="none").backward(g)

            fwd_b = _bytes(logits, labels, loss)
            rows.append(_row(
                f"softmax_xent {BATCH}x{k}", "fwd", cc(cc_sm),
                th(lambda x=tl, y=tyl: F.cross_entropy(x, y, reduction="none")), fwd_b,
            ))  # fmt: skip
            rows.append(_row(
                f"softmax_xent {BATCH}x{k}", "fwd+bwd", cc(cc_sm_fb), th(th_sm_fb),
                fwd_b + _bytes(logits, labels, g, logits),
            ))  # fmt: skip
            gsl.check_label_flag(flag, gyl, "bench softmax_xent", k, 0)
        except Exception as e:  # report it, keep measuring the others
            msg = f"softmax K={k}: {type(e).__name__}: {e}"
            print(f"bench_layers: FAILED {msg}", flush=True)
            failures.append(msg)

    extra = {
        "failures": failures,
        "copy_ceiling_gbps": COPY_CEILING_GBPS,
        "graph_repeat": args.repeat,
        "kernel_floor_ms": floor_ms,
        "notes": (
            "min_bytes = every input read once + every output written once; "
            f"cc2ops_ms/peer_ms: CUDA-graph replays of {args.repeat} calls back to "
            "back, per call (device time), *_eager_ms: eager calls; "
            "kernel_floor_ms: a one-float torch kernel timed the same way; cc2ops "
            "launch functions on GPUArrays on cc2ops's stream"
        ),
    }
    return write_results("layers", rows, torch_peer(), args.out, extra=extra)


if __name__ == "__main__":
    main()
