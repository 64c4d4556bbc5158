"""Timing and result-file helpers shared by every cc2ops benchmark.

Every benchmark checks correctness before it times, times cc2ops and its peer
(PyTorch/cuDNN) in the same process, and writes one JSON file per run under
``benchmarks/results/`` named ``<benchmark>-<gpu>-<YYYYMMDD>.json`` in the
form of the project's BENCHMARK_RESULTS spec::

    {"benchmark": "conv", "gpu": "NVIDIA H200", "date": "2026-12-03",
     "commit": "<sha>", "peer": "torch 2.11.0+cu130, cuDNN 91900",
     "rows": [{"name": ..., "batch": ..., "pass": ..., "precision": ...,
               "cc2ops_ms": ..., "peer_ms": ..., "ratio": ...}, ...]}

Timing
------
:func:`time_graph` times a callable's device work replayed as a CUDA graph
(both libraries captured the same way, launch overhead excluded): the
``cc2ops_ms`` / ``peer_ms`` of the kernel benchmarks. :func:`time_cuda`
times eager calls (host launch cost included), reported beside them.

cc2ops launches its kernels on its own stream per device
(``cc2ops.cuda.runtime.device``),
PyTorch on its current stream. Both share the device's primary context, so
:func:`time_cuda` records CUDA events on the stream the timed callable uses:
``on="torch"`` (torch events on torch's current stream) or ``on="cc2ops"``
(pycuda events on cc2ops's stream for ``device``). Each repetition is bracketed
by its own event pair and the median is reported, after ``warmup`` untimed
calls; the device is synchronised before and after, so work from the other
library never overlaps a measurement.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RESULTS_DIR",
    "PASSES",
    "PRECISIONS",
    "base_parser",
    "time_cuda",
    "time_graph",
    "time_host",
    "gpu_name",
    "gpu_tag",
    "git_commit",
    "torch_peer",
    "markdown_table",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: The H200's device-to-device copy bandwidth (GB/s, bytes read + written):
#: what memory-bound kernels are measured against.
COPY_CEILING_GBPS = 4190.0
PASSES = ("fwd", "bwd_data", "bwd_filter", "bwd", "fwd+bwd", "step")
PRECISIONS = ("fp32", "tf32", "bf16")
_REQUIRED = ("name", "batch", "pass", "precision", "cc2ops_ms", "peer_ms", "ratio")


def base_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every benchmark accepts: ``--out DIR`` and ``--quick``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory for the JSON result file (default benchmarks/results)",
    )
    p.add_argument(
        "--quick", action="store_true", help="fewer sizes and repetitions (a smoke run)"
    )
    p.add_argument("--iters", type=int, default=30, help="timed repetitions")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up calls")
    return p


def _sync_all(device: int) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:
        pass
    try:
        from cc2ops.cuda.runtime.device import initialized_devices

        for dev in initialized_devices():
            dev.synchronize()
    except Exception:  # cc2ops.cuda not initialised: nothing of ours to wait for
        pass


def time_cuda(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    iters: int = 30,
    on: str = "torch",
    device: int = 0,
) -> float:
    """Median milliseconds of ``fn()`` measured with CUDA events.

    Parameters
    ----------
    fn : callable
        Launches the work (asynchronously); takes no arguments.
    warmup, iters : int
        Untimed calls, then timed repetitions (each with its own event pair).
    on : {"torch", "cc2ops"}
        Which stream the events are recorded on: torch's current stream, or
        cc2ops's stream of ``device`` (pycuda events).
    device : int
        cc2ops device label (``on="cc2ops"``).
    """
    if iters < 1 or warmup < 0:
        raise ValueError(
            f"time_cuda: need iters >= 1 and warmup >= 0, got {iters}, {warmup}"
        )
    for _ in range(warmup):
        fn()
    _sync_all(device)
    times: list[float] = []
    if on == "torch":
        import torch

        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in pairs]
    elif on == "cc2ops":
        import pycuda.driver as drv

        from cc2ops.cuda.runtime.device import get_device

        dev = get_device(device)
        dev.activate()
        pairs = [(drv.Event(), drv.Event()) for _ in range(iters)]
        for start, end in pairs:
            start.record(dev.stream)
            fn()
            end.record(dev.stream)
        pairs[-1][1].synchronize()
        times = [e.time_since(s) for s, e in pairs]
    else:
        raise ValueError(f"time_cuda: on must be 'torch' or 'cc2ops', got {on!r}")
    _sync_all(device)
    return float(statistics.median(times))


def time_graph(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    iters: int = 30,
    on: str = "torch",
    device: int = 0,
    repeat: int = 1,
) -> float:
    """Median milliseconds of ``fn``'s device work, replayed as a CUDA graph.

    ``fn`` is called ``warmup`` times eagerly (kernels compiled, algorithms
    chosen), captured once into a CUDA graph (``on="cc2ops"``:
    :class:`cc2ops.cuda.CudaGraph` on cc2ops's stream; ``on="torch"``:
    ``torch.cuda.graph`` after a warm-up on a side stream, as PyTorch asks),
    and the graph's replays are timed with CUDA events, one pair each. This
    is the time of the kernels themselves, back to back, without the host
    cost of launching them (the same for both libraries).

    ``repeat`` > 1 captures ``fn`` that many times in a row into the one graph
    and returns a replay's time divided by ``repeat``: the time per call when
    calls follow each other (as a training step's kernels do), without the
    few microseconds a graph launch adds once per replay.
    """
    if iters < 1 or warmup < 1 or repeat < 1:
        raise ValueError(
            "time_graph: need iters >= 1, warmup >= 1 and repeat >= 1, got "
            f"{iters}, {warmup}, {repeat}"
        )
    if repeat > 1:
        once = fn

        def fn() -> None:
            for _ in range(repeat):
                once()

        return time_graph(fn, warmup=warmup, iters=iters, on=on, device=device) / repeat
    if on == "cc2ops":
        from cc2ops.cuda.runtime.cudagraph import CudaGraph

        for _ in range(warmup):
            fn()
        _sync_all(device)
        graph = CudaGraph(device)
        try:
            graph.capture(fn)
            return time_cuda(graph.replay, warmup=2, iters=iters, on="cc2ops",
                             device=device)  # fmt: skip
        finally:
            graph.close()
    if on != "torch":
        raise ValueError(f"time_graph: on must be 'torch' or 'cc2ops', got {on!r}")
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_cuda(graph.replay, warmup=2, iters=iters, on="torch")


def time_host(
    fn: Callable[[], Any], *, warmup: int = 3, iters: int = 20, device: int = 0
) -> float:
    """Median wall-clock milliseconds of ``fn()`` including a full device sync.

    For whole compiled functions whose work spans streams and host code.
    """
    import time

    for _ in range(warmup):
        fn()
    _sync_all(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync_all(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


def gpu_name(device: int = 0) -> str:
    """The device's marketing name (torch, else pycuda, else "unknown")."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(device)
    except ImportError:
        pass
    try:
        from cc2ops.cuda.runtime.device import get_device

        return get_device(device).name
    except Exception:
        return "unknown"


def gpu_tag(name: str) -> str:
    """Short lowercase tag for file names: "NVIDIA H200" -> "h200"."""
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return "-".join(words) or "gpu"


def git_commit() -> str:
    """The measured code's commit: ``CC2OPS_COMMIT`` or ``git rev-parse HEAD``."""
    env = os.environ.get("CC2OPS_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def torch_peer() -> str:
    """ "torch <version>, cuDNN <version>" of the peer in this process."""
    import torch

    return f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None
) -> str:
    """The rows as a markdown table (``columns`` default: the union of keys)."""
    if columns is None:
        # scalar fields only: lists (per-op breakdowns) stay in the JSON file
        columns = []
        for r in rows:
            for k, v in r.items():
                if k not in columns and not isinstance(v, (list, dict, tuple)):
                    columns.append(k)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _check_row(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    if "ratio" not in row and row.get("peer_ms"):
        row["ratio"] = row["cc2ops_ms"] / row["peer_ms"]
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise ValueError(f"write_results: row {row} lacks {missing}")
    if row["pass"] not in PASSES:
        raise ValueError(
            f"write_results: pass must be one of {PASSES}, got {row['pass']!r}"
        )
    if row["precision"] not in PRECISIONS:
        raise ValueError(
            f"write_results: precision must be one of {PRECISIONS}, "
            f"got {row['precision']!r}"
        )
    for k, v in row.items():
        if isinstance(v, (np.floating, np.integer)):
            row[k] = v.item()
        if isinstance(row[k], float) and np.isfinite(row[k]):
            # 6 significant digits: times keep their microseconds, errors of
            # 1e-7 keep their value (fixed decimals would round them to 0)
            row[k] = float(f"{row[k]:.6g}")
    return row


def write_results(
    benchmark: str,
    rows: Sequence[dict[str, Any]],
    peer: str,
    out_dir: Path | str = RESULTS_DIR,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``<out_dir>/<benchmark>-<gpu>-<YYYYMMDD>.json``; print the table.

    A same-day file is replaced: git keeps the earlier version, and every file
    records the commit it measured (``commit``).

    Returns the path. ``extra`` adds top-level keys (e.g. notes, settings).
    """
    checked = [_check_row(r) for r in rows]
    name = gpu_name()
    today = _dt.date.today()
    doc: dict[str, Any] = {
        "benchmark": benchmark,
        "gpu": name,
        "date": today.isoformat(),
        "commit": git_commit(),
        "peer": peer,
        "rows": checked,
    }
    if extra:
        doc.update(extra)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{benchmark}-{gpu_tag(name)}-{today:%Y%m%d}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"\n## {benchmark} on {name} ({today}, {doc['commit'][:10]}), peer {peer}\n")
    print(markdown_table(checked))
    print(f"\nwrote {path}")
    return path
