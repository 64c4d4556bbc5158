"""Images/s of the cuda-convnet2 ImageNet net on K GPUs ("one weird trick").

For K = 1 .. the number of GPUs (and K = 2 virtual labels on GPU 0 when
there is only one, which measures the overhead of the rewrite itself), and
for schemes (a) (all-gather of the conv activations) and (b) (one worker's
batch at a time, broadcast on a second stream), it times one momentum-SGD
step of a batch of 128 images per GPU (weak scaling, as in the paper) and
prints the speedup over K = 1 beside the paper's (2 GPUs 1.95x, 4 GPUs 3.74x,
8 GPUs 6.25x).

Before timing, the first loss of the K-device step is checked against the
single-device step on the same global batch. Dropout is off (the dropout op is
not declared batch-separable). Images enter from the host each step, as in a
training loop.

Usage: ``python benchmarks/bench_multi_gpu.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cc2ops  # noqa: E402
import cc2ops.cuda  # noqa: E402
from benchmarks.common import base_parser, time_host, write_results  # noqa: E402
from benchmarks.step_net import (  # noqa: E402
    imagenet_config,
    init_params,
    param_names,
    small_config,
)
from cc2ops.graph import multi_gpu as mg  # noqa: E402

PAPER_SPEEDUP = {1: 1.0, 2: 1.95, 4: 3.74, 8: 6.25}


def build(cfg, params, mode, labels, scheme):
    """The training step; distributed before pytensor.grad when K > 1."""
    x = pt.tensor(
        "images", dtype=cfg.dtype, shape=(None, cfg.channels, cfg.image, cfg.image)
    )
    y = pt.ivector("labels")
    shared = {
        n: cc2ops.cuda.shared(
            np.asarray(params[n], cfg.dtype), device=labels[0], name=n
        )
        for n in param_names(cfg)
    }
    h = x
    for i, layer in enumerate(cfg.conv):
        w, b = shared[f"conv{i + 1}_w"], shared[f"conv{i + 1}_b"]
        h = cc2ops.conv2d(h, w, stride=layer.stride, padding=layer.padding)
        h = pt.maximum(h + b.dimshuffle("x", 0, "x", "x"), 0)
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
        h = pt.maximum(pt.dot(h, shared[f"fc{j + 1}_w"]) + shared[f"fc{j + 1}_b"], 0)
    j = len(cfg.fc)
    logits = pt.dot(h, shared[f"fc{j + 1}_w"]) + shared[f"fc{j + 1}_b"]
    loss = cc2ops.softmax_cross_entropy(logits, y).mean()
    if len(labels) > 1:
        loss = mg.distribute(loss, mode, scheme=scheme)
    names = list(shared)
    grads = pytensor.grad(loss, [shared[n] for n in names])
    lr = np.asarray(cfg.lr, cfg.dtype)
    mom = np.asarray(cfg.momentum, cfg.dtype)
    wd = np.asarray(cfg.weight_decay, cfg.dtype)
    updates = []
    for n, g in zip(names, grads, strict=True):
        p = shared[n]
        v = cc2ops.cuda.shared(
            np.zeros_like(params[n], dtype=cfg.dtype), device=labels[0], name=f"v_{n}"
        )
        v_new = mom * v + (g + wd * p)
        updates += [(v, v_new), (p, p - lr * v_new)]
    return pytensor.function([x, y], loss, updates=updates, mode=mode)


def _mode(labels, scheme):
    if len(labels) == 1:
        return cc2ops.cuda.mode(labels[0])
    m = cc2ops.cuda.mode(devices=list(labels))
    if scheme == "b":
        m.backend.bcast_stream = "comm"
    return m


def main(argv=None) -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    import pycuda.driver as drv

    from cc2ops.cuda.availability import require

    require()
    n_gpus = drv.Device.count()
    per_gpu = 16 if args.quick else 128
    make_cfg = small_config if args.quick else imagenet_config
    iters = 3 if args.quick else args.iters
    runs = [(tuple(range(k)), "physical") for k in range(1, n_gpus + 1)]
    if n_gpus == 1:
        cc2ops.cuda.set_device_map({0: 0, 1: 0})
        runs.append(((0, 1), "virtual"))
    rows, base_ips = [], None
    r = np.random.default_rng(0)
    for labels, kind in runs:
        k = len(labels)
        for scheme in ("a", "b") if k > 1 else ("a",):
            cfg = make_cfg(batch=per_gpu * k, dropout=0.0)
            params = init_params(cfg, seed=0)
            images = r.normal(size=(cfg.batch, cfg.channels, cfg.image, cfg.image))
            images = images.astype(cfg.dtype)
            targets = r.integers(0, cfg.classes, cfg.batch).astype("int32")
            fn = build(cfg, params, _mode(labels, scheme), labels, scheme)
            loss = float(np.asarray(fn(images, targets)))
            if k > 1:  # correctness before timing: the single-device first loss
                ref = build(cfg, params, _mode((0,), "a"), (0,), "a")
                want = float(np.asarray(ref(images, targets)))
                if not np.isclose(loss, want, rtol=2e-3):
                    raise AssertionError(
                        f"K={k} scheme {scheme}: loss {loss} vs {want}"
                    )
            ms = time_host(
                lambda fn=fn, a=images, b=targets: fn(a, b), warmup=2, iters=iters
            )
            ips = cfg.batch / (ms / 1000.0)
            if k == 1:
                base_ips, base_ms = ips, ms
            speedup = ips / base_ips
            rows.append(
                {
                    "name": f"imagenet step K={k} ({kind})",
                    "batch": cfg.batch,
                    "pass": "step",
                    "precision": "tf32" if cc2ops.cuda.get_allow_tf32() else "fp32",
                    "cc2ops_ms": ms,
                    "peer_ms": base_ms,
                    "ratio": ms / base_ms,
                    "gpus": k,
                    "devices": kind,
                    "scheme": scheme,
                    "images_per_s": ips,
                    "speedup": speedup,
                    "paper_speedup": PAPER_SPEEDUP.get(k),
                }
            )
            print(
                f"K={k} {kind:8s} scheme {scheme}: {ms:8.2f} ms/step "
                f"{ips:9.1f} img/s speedup {speedup:5.2f} "
                f"(paper {PAPER_SPEEDUP.get(k)})"
            )
    write_results(
        "multi_gpu",
        rows,
        "cc2ops on 1 GPU, same run (peer_ms = the K=1 step)",
        args.out,
        extra={"per_gpu_batch": per_gpu, "paper_speedup": PAPER_SPEEDUP},
    )


if __name__ == "__main__":
    main()
