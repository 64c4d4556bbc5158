"""Whole ImageNet training step: cc2ops (GPU mode) vs the same net in PyTorch.

The cuda-convnet2 one-tower ImageNet net of ``benchmarks/step_net.py``
(batch 128, 224x224, cross-map norm, overlapping max pooling, dropout 0.5,
momentum SGD with weight decay) is timed as one training step:

- cc2ops: ``pytensor.function`` in ``cc2ops.cuda.mode()`` with
  ``cc2ops.cuda.shared`` parameters, GPU inputs (pre-uploaded minibatch) and
  GPU outputs, so a step never waits for the device; CUDA events on
  cc2ops's stream (``time_cuda(on="cc2ops")``).
- PyTorch: ``torch.nn.functional`` conv2d / relu / local_response_norm /
  max_pool2d(3, 2, ceil_mode=True) / linear / dropout / cross_entropy and
  ``torch.optim.SGD(momentum, weight_decay)``, ``cudnn.benchmark=True``;
  CUDA events on torch's stream.

Precisions: ``fp32`` (TF32 off in torch -- ``backends.cuda.matmul`` and
``backends.cudnn`` -- and in cc2ops) and ``tf32`` (on in both).

Correctness first: from the same initial parameters and minibatches, with
dropout off, a few fp32 steps of both must give the same losses (relative
1e-3). Then the per-op breakdown: the step compiled with ``profile=True``
and the Python VM (``cc2ops.cuda.mode(linker="py")``), each thunk wrapped to
synchronise the device after it, so PyTensor's profiler attributes GPU time
to the op that launched it (the timings include one launch + sync each,
so their sum exceeds the asynchronous step time). Top 10 op classes.

Run: ``python benchmarks/bench_step.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    base_parser,
    time_cuda,
    torch_peer,
    write_results,
)
from benchmarks.step_net import (  # noqa: E402
    NetConfig,
    build_step,
    imagenet_config,
    init_params,
)

# --------------------------------------------------------------------------
# PyTorch peer
# --------------------------------------------------------------------------


class TorchStep:
    """The same net and optimiser in PyTorch (parameters from ``init_params``)."""

    def __init__(self, cfg: NetConfig, params: dict[str, np.ndarray], dropout: bool):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.dropout = dropout and cfg.dropout > 0
        dev = torch.device("cuda")
        self.p: dict[str, Any] = {}
        for name, value in params.items():
            v = np.asarray(value)
            if name.startswith("fc") and name.endswith("_w"):
                v = v.T  # Linear.weight is (out, in)
            self.p[name] = torch.tensor(
                np.ascontiguousarray(v), device=dev, requires_grad=True
            )
        self.opt = torch.optim.SGD(
            list(self.p.values()),
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )

    def loss(self, x: Any, y: Any) -> Any:
        F = self.torch.nn.functional  # noqa: N806
        cfg, p = self.cfg, self.p
        h = x
        for i, layer in enumerate(cfg.conv):
            h = F.conv2d(
                h, p[f"conv{i + 1}_w"], p[f"conv{i + 1}_b"],
                stride=layer.stride, padding=layer.padding,
            )  # fmt: skip
            h = F.relu(h)
            if layer.norm:
                h = F.local_response_norm(
                    h, cfg.norm_size, alpha=cfg.norm_alpha, beta=cfg.norm_beta,
                    k=cfg.norm_k,
                )  # fmt: skip
            if layer.pool:
                h = F.max_pool2d(h, 3, 2, ceil_mode=True)
        h = h.flatten(1)
        for j in range(len(cfg.fc)):
            h = F.relu(F.linear(h, p[f"fc{j + 1}_w"], p[f"fc{j + 1}_b"]))
            if self.dropout:
                h = F.dropout(h, cfg.dropout, training=True)
        j = len(cfg.fc)
        logits = F.linear(h, p[f"fc{j + 1}_w"], p[f"fc{j + 1}_b"])
        return F.cross_entropy(logits, y)

    def step(self, x: Any, y: Any) -> Any:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        self.opt.step()
        return loss


def set_torch_tf32(flag: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag


# --------------------------------------------------------------------------
# cc2ops
# --------------------------------------------------------------------------


def cc2ops_step(cfg: NetConfig, params: dict, *, dropout: bool, linker: str = "cvm",
                profile: bool = False) -> tuple[Any, Any]:  # fmt: skip
    import cc2ops.cuda as cuda

    step = build_step(
        cfg, params, gpu_params=True, dropout=dropout, gpu_inputs=True,
        gpu_outputs=True,
    )  # fmt: skip
    fn = step.function(cuda.mode(linker=linker), profile=profile or None)
    return step, fn


def minibatches(cfg: NetConfig, n: int, seed: int = 0) -> list[tuple]:
    r = np.random.default_rng(seed)
    shape = (cfg.batch, cfg.channels, cfg.image, cfg.image)
    return [
        (
            r.standard_normal(shape).astype(cfg.dtype),
            r.integers(0, cfg.classes, cfg.batch).astype("int32"),
        )
        for _ in range(n)
    ]


def check_losses(cfg: NetConfig, params: dict, steps: int = 3) -> dict[str, Any]:
    """fp32, dropout off: cc2ops and torch losses over a few steps from one init."""
    import torch

    from cc2ops.cuda import allow_tf32, array

    data = minibatches(cfg, steps, seed=11)
    _, fn = cc2ops_step(cfg, params, dropout=False)
    ref = TorchStep(cfg, params, dropout=False)
    ours, theirs = [], []
    set_torch_tf32(False)
    with allow_tf32(False):
        for x, y in data:
            loss, _ = fn(array.to_gpu(x, 0), array.to_gpu(y, 0))
            ours.append(float(array.to_host(loss)))
            xt = torch.tensor(x, device="cuda")
            yt = torch.tensor(y.astype("int64"), device="cuda")
            theirs.append(float(ref.step(xt, yt)))
    rel = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True)
    )
    if not rel < 1e-3:
        raise SystemExit(
            f"bench_step: cc2ops and torch losses differ (max rel {rel:.2e}): "
            f"{ours} vs {theirs}"
        )
    return {"cc2ops_losses": ours, "torch_losses": theirs, "max_rel": rel}


def breakdown(cfg: NetConfig, params: dict, steps: int, tf32: bool) -> list[dict]:
    """Top-10 op classes by synchronised time per step (PyTensor's profiler)."""
    from cc2ops.cuda import allow_tf32, array
    from cc2ops.cuda.device import get_device

    _, fn = cc2ops_step(cfg, params, dropout=cfg.dropout > 0, linker="py", profile=True)
    dev = get_device(0)
    vm = fn.vm

    def synced(thunk: Any) -> Any:
        def run() -> Any:
            out = thunk()
            dev.synchronize()
            return out

        for attr in ("inputs", "outputs", "lazy", "perform"):
            if hasattr(thunk, attr):
                setattr(run, attr, getattr(thunk, attr))
        return run

    vm.thunks = [synced(t) for t in vm.thunks]
    x, y = minibatches(cfg, 1, seed=5)[0]
    gx, gy = array.to_gpu(x, 0), array.to_gpu(y, 0)
    with allow_tf32(tf32):
        fn(gx, gy)  # warm-up: kernels compiled and loaded
        for key in list(fn.profile.apply_time):
            fn.profile.apply_time[key] = 0.0
        for _ in range(steps):
            fn(gx, gy)
    per_op: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for (_fg, node), t in fn.profile.apply_time.items():
        per_op[type(node.op).__name__] += t
        calls[type(node.op).__name__] += 1
    total = sum(per_op.values())
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:10]
    return [
        {
            "op": name,
            "ms_per_step": 1e3 * t / steps,
            "share": t / total if total else 0.0,
            "nodes": calls[name],
        }
        for name, t in top
    ]


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args(argv)
    import torch

    from cc2ops.cuda import allow_tf32, array

    torch.backends.cudnn.benchmark = True
    batch = 32 if args.quick else args.batch
    iters = 5 if args.quick else args.iters
    warmup = 2 if args.quick else args.warmup
    cfg = imagenet_config(batch=batch)
    params = init_params(cfg, seed=0)

    check = check_losses(cfg, params, steps=2 if args.quick else 3)
    print(f"losses agree (max rel {check['max_rel']:.2e}): {check['cc2ops_losses']}")

    x, y = minibatches(cfg, 1, seed=1)[0]
    gx, gy = array.to_gpu(x, 0), array.to_gpu(y, 0)
    xt = torch.tensor(x, device="cuda")
    yt = torch.tensor(y.astype("int64"), device="cuda")
    _, fn = cc2ops_step(cfg, params, dropout=True)
    ref = TorchStep(cfg, params, dropout=True)

    rows = []
    breakdowns = {}
    for precision, tf32 in (("fp32", False), ("tf32", True)):
        set_torch_tf32(tf32)
        with allow_tf32(tf32):
            ours = time_cuda(
                lambda: fn(gx, gy), warmup=warmup, iters=iters, on="cc2ops"
            )
            theirs = time_cuda(lambda: ref.step(xt, yt), warmup=warmup, iters=iters)
        rows.append(
            {
                "name": f"imagenet_step_b{batch}",
                "batch": batch,
                "pass": "step",
                "precision": precision,
                "cc2ops_ms": ours,
                "peer_ms": theirs,
                "ratio": ours / theirs,
                "cc2ops_images_per_s": batch / (ours / 1e3),
                "peer_images_per_s": batch / (theirs / 1e3),
            }
        )
        breakdowns[precision] = breakdown(cfg, params, 2 if args.quick else 5, tf32)
    set_torch_tf32(False)
    for precision, table in breakdowns.items():
        print(f"\ncc2ops per-op time ({precision}, synchronised per thunk), top 10:")
        for r in table:
            print(
                f"  {r['op']:<32} {r['ms_per_step']:8.3f} ms  {100 * r['share']:5.1f}% "
                f"({r['nodes']} nodes)"
            )
    write_results(
        "step",
        rows,
        torch_peer(),
        args.out,
        extra={
            "loss_check": check,
            "breakdown": breakdowns,
            "timing": "CUDA events: cc2ops stream for cc2ops, torch stream for torch; "
            "breakdown: PyTensor profiler, device synchronised after each thunk",
        },
    )


if __name__ == "__main__":
    main()
