"""Fill a cubin cache with the benchmarks' convolution kernels, on any machine.

The autotuner compiles every candidate kernel of a convolution on its first
use (about a hundred for the five AlexNet layers in two precisions). This
script compiles them ahead, in parallel, for a given arch, so that a fresh
GPU machine given the cache (``CC2OPS_CACHE_DIR``) only loads them. Cache
entries are keyed by the ``nvcc --version`` text, so the cache helps where
the same nvcc build is installed.

Run: ``CC2OPS_CACHE_DIR=DIR python benchmarks/warm_cache.py [--arch sm_90]
[--batches 128,32,100] [--jobs N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_conv import LAYERS  # noqa: E402


def conv_specs(
    batches: list[int], precisions: list[str], capability: tuple[int, int] | None
) -> list:
    from cc2ops.cuda.ops.conv import ops as conv

    specs = []
    for batch in batches:
        for name, c, f, hw, k, s, p in LAYERS:
            g = conv.geometry_of(name, (batch, c, hw, hw), (f, c, k, k), (s, s),
                                 (p, p), 1)  # fmt: skip
            for op in ("filter_acts", "image_acts", "weight_acts"):
                for prec in precisions:
                    specs.extend(conv.kernel_specs(op, g, np.float32, prec,
                                                   capability=capability))  # fmt: skip
    return specs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--batches", default="128,32,100")
    ap.add_argument("--precisions", default="fp32,tf32")
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    from cc2ops.cuda.runtime.compile import cache_dir, precompile

    # the arch's own candidates too (wgmma tiles for sm_90)
    digits = args.arch.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")
    capability = (int(digits[:-1]), int(digits[-1]))
    specs = conv_specs(
        [int(b) for b in args.batches.split(",")],
        args.precisions.split(","),
        capability,
    )
    t0 = time.perf_counter()
    ran = precompile(specs, arch=args.arch, jobs=args.jobs)
    print(
        f"warm_cache: {len(specs)} specs, {ran} compiled in "
        f"{time.perf_counter() - t0:.0f} s into {cache_dir()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
