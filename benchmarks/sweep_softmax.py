"""The softmax cross-entropy forward's row splitting against what a read costs.

For logits (128, K), K = 1000 and 21841 (float32, integer labels), times
``softmax_cross_entropy_forward`` with every row split into S chunks (S = 1,
2, 3, 4, 6, 8, 12, 16 and the automatic choice) and, as references for what
reading the same bytes costs on this GPU, torch's row sum, row max and
``F.cross_entropy``, plus a one-float kernel (the floor of any kernel); all
CUDA-graph replays of 10 calls, time per call. Each split's loss is checked
against the float64 reference first. A tool for choosing the splitting rule,
not a result for BENCHMARKS.md.

Run: ``python benchmarks/sweep_softmax.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import COPY_CEILING_GBPS, time_graph  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    dev.activate()
    timing = dict(repeat=10, iters=20)
    rows: list[dict] = []

    def report(layer: str, setting: str, ms: float, nbytes: int) -> None:
        frac = nbytes / (ms * 1e-3) / 1e9 / COPY_CEILING_GBPS
        rows.append(dict(layer=layer, setting=setting, ms=ms, frac_copy_ceiling=frac))
        print(f"{layer} {setting:24s} {ms * 1e3:8.2f} us {frac:6.1%}", flush=True)

    one = torch.zeros(1, device="cuda")
    report("floor", "torch zero_ of 1 float", time_graph(one.zero_, **timing), 4)
    rng = np.random.default_rng(0)
    for k in (1000, 21841):
        _sweep(k, rng, report, timing, dev.multiprocessors)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return rows


def _sweep(k: int, rng, report, timing: dict, sms: int) -> None:
    import torch
    import torch.nn.functional as F

    from cc2ops.cuda.ops import softmax_cross_entropy as gsl
    from cc2ops.cuda.runtime import array
    from cc2ops.softmax_cross_entropy import softmax_cross_entropy_reference

    b = 128
    x = rng.standard_normal((b, k)).astype(np.float32) * 3
    y = rng.integers(0, k, b).astype(np.int64)
    gx, gy = array.to_gpu(x, 0), array.to_gpu(y, 0)
    flag = gsl.new_label_flag(0)
    want = softmax_cross_entropy_reference(x.astype(np.float64), y)
    nbytes = x.nbytes + y.nbytes + b * 4
    layer = f"{b}x{k}"
    for s in (1, 2, 3, 4, 6, 8, 12, 16, None):
        got = array.to_host(gsl.softmax_cross_entropy_forward(gx, gy, splits=s), 0)
        err = np.abs(got - want).max() / np.abs(want).max()
        if not err < 1e-5:
            raise SystemExit(f"{layer} S={s}: relative error {err:.3g}")

        def call(s=s):
            gsl.softmax_cross_entropy_forward(gx, gy, check=False, flag=flag, splits=s)

        ms = time_graph(call, on="cc2ops", device=0, **timing)
        auto = gsl.forward_splits(b, k, 4, sms)
        report(layer, f"S={s}" if s else f"S=auto ({auto})", ms, nbytes)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    report(layer, "torch sum(1)", time_graph(lambda: tx.sum(1), **timing), nbytes)
    report(layer, "torch amax(1)", time_graph(lambda: tx.amax(1), **timing), nbytes)
    xent = lambda: F.cross_entropy(tx, ty, reduction="none")  # noqa: E731
    report(layer, "torch cross_entropy", time_graph(xent, **timing), nbytes)


if __name__ == "__main__":
    main()
