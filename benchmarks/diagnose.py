"""Where does the GPU time go? Host (launch) time against device time, op by op.

A diagnostic run, not a benchmark: it answers "is this slow because of the
kernels or because of the Python that launches them?" before anyone tunes
a kernel. Sections (each under its own time budget, results written after
each):

``micro``
    Host cost of the runtime's building blocks on this machine: allocating
    a GPUArray, launching a kernel through ``compile.launch``, a cuBLAS
    GEMM call, a stream synchronisation round trip.
``step``
    The cuda-convnet2 ImageNet step (``cc2ops.testing.nets``, batch 128,
    dropout off) compiled with the Python VM and profiled node by node with
    :class:`cc2ops.cuda.runtime.profile.ThunkProfile` (host and device time apart),
    in fp32 and TF32; then the eager step (``cvm``) and the same step
    replayed as a CUDA graph (:func:`cc2ops.cuda.capture_function`), timed
    with events, and torch's step for scale.
``cgemm``
    Whether the FFT passes' complex GEMM holds the host, fp32 against TF32
    (:func:`cgemm_section`).
``conv``
    Every applicable algorithm of every pass of the five AlexNet layers at
    batch 128, fp32 and TF32: device and host time apart
    (:func:`cc2ops.cuda.runtime.profile.split_time`), and cuDNN's device time.

Run: ``python benchmarks/diagnose.py [--sections step,conv,micro]
[--out FILE]``; prints a summary and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_conv import LAYERS, _torch_pass, _torch_settings  # noqa: E402
from benchmarks.common import time_cuda  # noqa: E402

RESULT: dict[str, Any] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def host_us(fn: Any, n: int = 200) -> float:
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def micro() -> dict[str, Any]:
    from cc2ops.cuda.libs import cublas as blas
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    out: dict[str, Any] = {}
    x = array.empty((128, 64, 54, 54), np.float32, 0)
    out["empty_us"] = host_us(lambda: array.empty((128, 64, 54, 54), np.float32, 0))
    out["fill_launch_us"] = host_us(lambda: array.fill(x, 1.0, device=0))
    a = array.to_gpu(np.ones((256, 256), np.float32), 0)
    c = array.empty((256, 256), np.float32, 0)
    out["gemm_call_us"] = host_us(lambda: blas.gemm(a, a, c, device=0))
    dev.synchronize()
    out["sync_empty_us"] = host_us(dev.synchronize)

    def tiny() -> None:
        array.fill(a, 0.0, device=0)
        dev.synchronize()

    out["tiny_kernel_and_sync_us"] = host_us(tiny)

    # the floor under a replayed launch tape: pycuda's launch with the
    # argument buffer packed beforehand, the packing, and a pool allocation
    from pycuda._pvt_struct import pack

    from cc2ops.cuda.runtime.array import _fill_name, ptr
    from cc2ops.cuda.runtime.compile import get_kernel

    fn = get_kernel("fill", 0, name=_fill_name(4), unit=4)
    args = (ptr(a), np.int64(a.size), np.uint64(0), np.uint64(0), np.int64(1))
    fmt = fn.arg_format
    packed = pack(fmt, *args)
    grid, block, stream = (64, 1, 1), (256, 1, 1), dev.stream
    out["launch_kernel_prepacked_us"] = host_us(
        lambda: fn._launch_kernel(grid, block, packed, 0, stream)
    )
    out["pack_args_us"] = host_us(lambda: pack(fmt, *args))
    raw = dev.allocator.raw
    out["pool_allocate_free_us"] = host_us(lambda: raw(1 << 20))
    dev.synchronize()
    return out


def step_section(budget_s: float) -> dict[str, Any]:
    import torch

    import cc2ops.cuda as cuda
    from benchmarks.bench_step import TorchStep, set_torch_tf32
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.profile import ThunkProfile
    from cc2ops.testing.nets import StepConfig, build_step

    t0 = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    cfg = StepConfig("imagenet", batch=128, dropout=False)
    params = cfg.init_params()
    r = np.random.default_rng(1)
    x = r.standard_normal(cfg.image_shape).astype(np.float32)
    y = r.integers(0, cfg.classes, cfg.batch).astype(np.int32)
    gx, gy = array.to_gpu(x, 0), array.to_gpu(y, 0)
    out: dict[str, Any] = {}

    def build(linker: str) -> Any:
        step = build_step(
            cfg, params, gpu_params=True, gpu_inputs=True, gpu_outputs=True
        )
        return step.function(cuda.mode(linker=linker))

    log("step: compiling (py VM) for the profile")
    pfn = build("py")
    prof = ThunkProfile(pfn)
    for precision, tf32 in (("fp32", False), ("tf32", True)):
        with cuda.allow_tf32(tf32):
            res = prof.run(gx, gy, steps=1, warmup=1)
        out[f"profile_{precision}"] = res
        log(
            f"step profile {precision}: device {res['device_ms']:.2f} ms, host "
            f"{res['host_ms']:.2f} ms per step; synchronising: "
            f"{res['synchronizing_nodes']}"
        )
        for e in res["by_op"][:14]:
            log(
                f"   {e['op']:<28} dev {e['device_ms']:7.3f} host {e['host_ms']:7.3f}"
                f"  ({e['nodes']} nodes)"
            )
        if time.perf_counter() - t0 > budget_s:
            return out
    log("step: compiling (cvm) for eager and graph timings")
    fn = build("cvm")
    ref = TorchStep(cfg, params, dropout=False)
    xt = torch.tensor(x, device="cuda")
    yt = torch.tensor(y.astype("int64"), device="cuda")
    for precision, tf32 in (("fp32", False), ("tf32", True)):
        set_torch_tf32(tf32)
        with cuda.allow_tf32(tf32):
            eager = time_cuda(lambda: fn(gx, gy), warmup=3, iters=10, on="cc2ops")
            captured = cuda.capture_function(fn, warmup=1)
            try:
                graph = time_cuda(
                    lambda c=captured: c(gx, gy), warmup=3, iters=10, on="cc2ops"
                )
                nodes = captured.graph.nodes if captured.graph else None
                loss_graph = float(array.to_host(captured(gx, gy)[0]))
            except Exception as e:
                traceback.print_exc()
                graph, nodes, loss_graph = None, None, f"{type(e).__name__}: {e}"
            finally:
                captured.close()
            peer = time_cuda(lambda: ref.step(xt, yt), warmup=3, iters=10)
        set_torch_tf32(False)
        out[f"timing_{precision}"] = dict(
            eager_ms=eager, graph_ms=graph, torch_ms=peer, graph_nodes=nodes,
            loss_after_graph=loss_graph,
        )  # fmt: skip
        log(f"step {precision}: eager {eager:.2f} ms, graph {graph}, torch {peer:.2f}")
        if time.perf_counter() - t0 > budget_s:
            break
    return out


def _pass_call(
    pas: str, gx: Any, gw: Any, gdy: Any, sizes: tuple, prm: dict, alg: str
) -> Any:
    from cc2ops.cuda.ops.conv import ops as conv

    hw, k = sizes
    if pas == "fwd":
        return lambda: conv.filter_acts(gx, gw, **prm, algorithm=alg)
    if pas == "bwd_data":
        return lambda: conv.image_acts(gdy, gw, (hw, hw), **prm, algorithm=alg)
    return lambda: conv.weight_acts(gx, gdy, (k, k), **prm, algorithm=alg)


def conv_section(
    budget_s: float,
    layers: tuple[str, ...] = tuple(layer[0] for layer in LAYERS),
    passes: tuple[str, ...] = ("fwd", "bwd_data", "bwd_filter"),
    precisions: tuple[str, ...] = ("tf32", "fp32"),
) -> dict[str, Any]:
    import torch

    from cc2ops.cuda.ops.conv import ops as conv
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.profile import split_time

    t0 = time.perf_counter()
    rows = []
    batch = 128
    for precision in precisions:
        _torch_settings(precision)
        for layer in LAYERS:
            name, c, f, hw, k, s, p = layer
            if name not in layers:
                continue
            r = np.random.default_rng(0)
            ho = (hw + 2 * p - k) // s + 1
            xs = r.standard_normal((batch, c, hw, hw)).astype(np.float32)
            ws = (r.standard_normal((f, c, k, k)) / np.sqrt(c * k * k)).astype(
                np.float32
            )
            dys = r.standard_normal((batch, f, ho, ho)).astype(np.float32)
            gx, gw, gdy = (array.to_gpu(a, 0) for a in (xs, ws, dys))
            tx, tw, tdy = (torch.from_numpy(a).cuda() for a in (xs, ws, dys))
            g = conv.geometry_of(name, xs.shape, ws.shape, (s, s), (p, p), 1)
            prm = dict(stride=s, padding=p, precision=precision, device=0)
            for pas, op in (("fwd", "filter_acts"), ("bwd_data", "image_acts"),
                            ("bwd_filter", "weight_acts")):  # fmt: skip
                if pas not in passes:
                    continue
                peer = time_cuda(_torch_pass(pas, tx, tw, tdy, s, p), warmup=3,
                                 iters=10)  # fmt: skip
                # device=0: the candidates of this GPU's compute capability too
                for alg in conv.algorithm_names(op, g, np.float32, precision, 0):
                    call = _pass_call(pas, gx, gw, gdy, (hw, k), prm, alg)
                    row = dict(layer=name, pass_=pas, precision=precision,
                               algorithm=alg, peer_ms=peer)  # fmt: skip
                    try:
                        st = split_time(call, 0, reps=3)
                        row.update(device_ms=st.device_ms, host_ms=st.host_ms,
                                   sync=st.synchronizes)  # fmt: skip
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"
                    rows.append(row)
                    log(f"conv {row}")
                    if time.perf_counter() - t0 > budget_s:
                        return {"rows": rows, "cut": True}
    return {"rows": rows}


def cgemm_section() -> dict[str, Any]:
    """Does the FFT passes' complex GEMM hold the host? (benchmarks/notes/step.md:
    a TF32 FFT pass returns only when its work is done, an fp32 one at once.)

    The forward product of an ImageNet conv2-sized FFT pass (544 bins, 192 x 64
    filters, 32 images) through ``blas.gemm_strided_batched_complex``, in fp32
    and TF32, then TF32 again with a 256 MiB cuBLAS workspace, and the real
    TF32 GEMM of the same data volume (``gemm_strided_batched``, the operands
    as real matrices of twice the width) for scale. Each under
    :func:`split_time`: host and device time, and whether the call waited.
    """
    from cc2ops.cuda.libs import cublas as blas
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device
    from cc2ops.cuda.runtime.profile import split_time

    bins, f, c, nb = 544, 192, 64, 32
    r = np.random.default_rng(0)

    def cplx(*shape: int) -> np.ndarray:
        z = r.standard_normal(shape) + 1j * r.standard_normal(shape)
        return z.astype(np.complex64)

    a, b = array.to_gpu(cplx(bins, f, c), 0), array.to_gpu(cplx(bins, c, nb), 0)
    out = array.empty((bins, f, nb), np.complex64, 0)
    ar = array.to_gpu(r.standard_normal((bins, f, 2 * c)).astype(np.float32), 0)
    br = array.to_gpu(r.standard_normal((bins, 2 * c, 2 * nb)).astype(np.float32), 0)
    outr = array.empty((bins, f, 2 * nb), np.float32, 0)
    rows: dict[str, Any] = {}

    def complex_call(precision: str) -> Any:
        return lambda: blas.gemm_strided_batched_complex(
            a, b, out, device=0, precision=precision
        )

    def record(name: str, fn: Any) -> None:
        try:
            st = split_time(fn, 0, reps=5, warmup=2)
            rows[name] = dict(host_ms=st.host_ms, device_ms=st.device_ms,
                              synchronizes=st.synchronizes)  # fmt: skip
        except Exception as e:
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
        log(f"cgemm {name}: {rows[name]}")

    record("complex_fp32", complex_call("fp32"))
    record("complex_tf32", complex_call("tf32"))
    record(
        "real_tf32_same_bytes",
        lambda: blas.gemm_strided_batched(ar, br, outr, device=0, precision="tf32"),
    )
    handle = blas.get_handle(0)
    big = 256 << 20
    ws = array.empty((big,), np.uint8, 0)
    blas._call("set_workspace", handle, int(ws.gpudata), big)
    try:
        record("complex_tf32_workspace_256mib", complex_call("tf32"))
    finally:
        own = blas._workspaces[get_device(0).index]
        blas._call("set_workspace", handle, int(own), blas.WORKSPACE_BYTES)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="micro,step,conv")
    ap.add_argument("--out", type=Path, default=Path("diagnose.json"))
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per section")
    ap.add_argument("--conv-layers", default="conv1,conv2,conv3,conv4,conv5")
    ap.add_argument("--conv-passes", default="fwd,bwd_data,bwd_filter")
    ap.add_argument("--conv-precisions", default="tf32,fp32")
    args = ap.parse_args(argv)
    import cc2ops.cuda as cuda

    cuda.require()
    sections = {"micro": lambda: micro(), "cgemm": lambda: cgemm_section(),
                "step": lambda: step_section(args.budget),
                "conv": lambda: conv_section(
                    args.budget, tuple(args.conv_layers.split(",")),
                    tuple(args.conv_passes.split(",")),
                    tuple(args.conv_precisions.split(",")))}  # fmt: skip
    status = 0
    for name in args.sections.split(","):
        log(f"== {name}")
        try:
            RESULT[name] = sections[name]()
        except Exception as e:
            traceback.print_exc()
            RESULT[name] = {"error": f"{type(e).__name__}: {e}"}
            status = 1
        args.out.write_text(json.dumps(RESULT, indent=1, default=str))
        if name in ("micro", "cgemm"):
            log(json.dumps(RESULT[name]))
    return status


if __name__ == "__main__":
    sys.exit(main())
