"""Pooling forward kernels' launch parameters against the copy ceiling.

For AlexNet's pooling inputs (batch 128, 64x54x54 and 192x27x27, float32),
times ``max_pool_forward`` and ``avg_pool_forward`` (CUDA-graph replays, 10
calls per replay) for the per-element kernels and for the plane kernels at
several group sizes (``pool._PLANE_PIXELS``) and grid caps
(``pool._PLANE_GRID``), checking each output against the first. Prints one
line per setting and writes the rows to ``--out`` (JSON) when given; a tool
for choosing the defaults, not a result for BENCHMARKS.md.

Run: ``python benchmarks/sweep_pool.py [--out FILE]``.
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

    from cc2ops.cuda.ops import pool as gpool
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    dev.activate()
    defaults = (gpool._PLANE_PIXELS, gpool._PLANE_SMEM, gpool._PLANE_GRID)
    settings = [("per-element", 4096, 0, None)]
    for pixels in (2048, 4096, 6144):
        for grid in (None, dev.multiprocessors * 4, dev.multiprocessors * 2):
            settings.append((f"plane px{pixels} grid{grid}", pixels, 48 * 1024, grid))
    rows = []
    rng = np.random.default_rng(0)
    for c, hw in ((64, 54), (192, 27)):
        x = array.to_gpu(rng.standard_normal((128, c, hw, hw)).astype("float32"), 0)
        for name, fwd in (
            ("max", gpool.max_pool_forward),
            ("avg", gpool.avg_pool_forward),
        ):
            want = None
            for label, pixels, smem, grid in settings:
                gpool._PLANE_PIXELS, gpool._PLANE_SMEM, gpool._PLANE_GRID = (
                    pixels,
                    smem,
                    grid,
                )
                try:
                    y = fwd(x, 3, 2)
                    got = array.to_host(y, 0)
                    if want is None:
                        want = got
                    elif not np.array_equal(got, want):
                        raise SystemExit(f"{name} {c}x{hw} {label}: output differs")
                    call = lambda f=fwd, a=x: f(a, 3, 2)  # noqa: E731
                    ms = time_graph(call, on="cc2ops", device=0, repeat=10, iters=20)
                finally:
                    gpool._PLANE_PIXELS, gpool._PLANE_SMEM, gpool._PLANE_GRID = defaults
                nbytes = x.nbytes + y.nbytes
                frac = nbytes / (ms * 1e-3) / 1e9 / COPY_CEILING_GBPS
                rows.append(dict(layer=f"{name} {c}x{hw}^2", setting=label, ms=ms,
                                 frac_copy_ceiling=frac))  # fmt: skip
                print(f"{name} {c}x{hw}^2 {label:32s} {ms * 1e3:8.2f} us {frac:6.1%}",
                      flush=True)  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
