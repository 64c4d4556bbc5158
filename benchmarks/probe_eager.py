"""Eager step probe: enqueue time, wall time and host cost per node, no peers.

A quick diagnostic, not a benchmark (no torch in the run, so no result file):
for the cifar18 step at batch 128 in fp32 and the ImageNet step at batch 32
in TF32 (issue 18's eager rows), the GPU-input step compiled with the C VM is
called 5 times to record its launch tapes, then

- ``enqueue_ms``: median host time of one call after a synchronisation;
- ``wall_ms``: median of back-to-back calls with CUDA events
  (:func:`benchmarks.common.time_cuda`);

and the same step compiled with the Python VM goes through
:func:`benchmarks.bench_step.breakdown` (per-op-class host cost per node,
which taped nodes replay). Prints one JSON line per step and writes all of
it to ``$OUT/probe_eager.json`` (``/tmp`` without ``$OUT``).

Run on the GPU machine: ``python benchmarks/probe_eager.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_step import breakdown, cc2ops_step, minibatches  # noqa: E402
from benchmarks.common import time_cuda  # noqa: E402

STEPS = (("cifar18", 128, False), ("imagenet", 32, True))
SHOWN = ("enqueue_ms", "wall_ms", "nodes", "host_us_per_node", "tapes",
         "device_ms_summed", "host_ms_summed", "host_bar_met")  # fmt: skip


def probe(net: str, batch: int, tf32: bool) -> dict:
    from cc2ops.cuda import allow_tf32
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device
    from cc2ops.testing.nets import StepConfig

    cfg = StepConfig(net, batch=batch, dropout=False)
    params = cfg.init_params()
    x, y = minibatches(cfg, 1)[0]
    gx, gy = array.to_gpu(x, 0), array.to_gpu(y, 0)
    _, fn = cc2ops_step(cfg, params, dropout=False)
    dev = get_device(0)
    with allow_tf32(tf32):
        for _ in range(5):
            fn(gx, gy)
        enqueue = []
        for _ in range(10):
            dev.synchronize()
            t0 = time.perf_counter()
            fn(gx, gy)
            enqueue.append((time.perf_counter() - t0) * 1e3)
        wall = time_cuda(lambda: fn(gx, gy), warmup=3, iters=15, on="cc2ops")
    _, pfn = cc2ops_step(cfg, params, dropout=False, linker="py")
    return dict(
        enqueue_ms=float(np.median(enqueue)), wall_ms=wall, nodes=len(fn.vm.nodes),
        **breakdown(pfn, (gx, gy), 2, tf32),
    )  # fmt: skip


def main() -> int:
    import cc2ops.cuda as cuda

    if not cuda.is_available():
        print(f"probe_eager: no GPU here ({cuda.unavailable_reason()})")
        return 0
    out = {}
    for net, batch, tf32 in STEPS:
        name = f"{net}_b{batch}_{'tf32' if tf32 else 'fp32'}"
        out[name] = r = probe(net, batch, tf32)
        print(name, json.dumps({k: r[k] for k in SHOWN}), flush=True)
    path = Path(os.environ.get("OUT", "/tmp")) / "probe_eager.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
