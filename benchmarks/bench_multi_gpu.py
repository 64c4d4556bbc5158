"""Images/s of the cuda-convnet2 ImageNet net on K GPUs ("one weird trick").

For K = 1 and every power of two up to the number of GPUs (K = 1 and 2 with
``--quick``; on a one-GPU machine K = 2 is two *virtual* labels on GPU 0,
mapped with ``cc2ops.cuda.set_device_map``, which measures the overhead of the
rewrite itself: the ideal "speedup" there is 1.0, not 2), and for schemes
(a) (all-gather of the conv activations) and (b) (one worker's batch at a
time, by broadcast), it times one momentum-SGD step of ``--per-gpu-batch``
images per device (weak scaling, as in the paper: 128, or 32 with
``--quick``) and prints the speedup over K = 1 beside the paper's (2 GPUs
1.95x, 4 GPUs 3.74x, 8 GPUs 6.25x).

Correctness before timing: the first loss of every K-device step equals the
single-device loss on the same global batch, computed as the mean of the K = 1
step's first loss on each per-device slice of that batch (equal slices, the
same initial parameters, reset between the calls). Dropout is off. Images
enter from the host each step, as in a training loop, and the whole step is
timed on the host clock with a full device sync (``common.time_host``).

The peer of every row is the K = 1 cc2ops step at the same per-device batch,
same run (``peer_ms``; ``ratio = cc2ops_ms / peer_ms``,
``speedup = K * peer_ms / cc2ops_ms``).

Communication vs compute, after all timed rows (a stage of its own: a failure
there or the time cap keeps every timed row): each configuration's step is
compiled again with the Python VM (``linker="py"``), each thunk of
``fn.vm.thunks`` is wrapped to synchronise every device of the configuration
after it, and over a few steps the synchronised times of the collectives
(``cc2ops.cuda.ops.comm.GPU_COMM_OPS``: GpuAllGather, GpuReduceScatter,
GpuAllReduce, GpuBroadcast, GpuReduce) and of all other ops (host-to-device
upload of the images included) are summed: ``comm_ms_sync``,
``compute_ms_sync`` (ms per step), ``comm_ops_ms_sync`` (per collective
class), ``sync_step_ms`` (wall time of the synchronised step). Scheme (b)
rows also get ``overlap_ms = comm_ms_sync + compute_ms_sync - cc2ops_ms``.
Synchronising after each op serialises the streams (and adds a launch and a
sync per op), so that difference is an estimate of the overlap the real,
unsynchronised step obtains, not a measurement; the same difference on a
scheme (a) row of the same K (no second stream) shows how much of it is
per-op sync overhead. On virtual devices the broadcasts are device copies on
the main stream (the second stream is an NCCL option), so no overlap is
expected there.

A hard time cap (``--time-cap``, default 90 s with ``--quick``) stops the run
between or inside configurations; a configuration that fails is recorded under
``failures``. The result file is written with the rows gathered so far in
every case.

One process per device (``--spmd``, under ``mpirun -n K``; see
:func:`spmd_main`): the per-rank step of ``cc2ops.distributed`` and the time
in its collectives; on one GPU, ``mpirun -n 1`` must be within 5 % of the
single-process step (its peer). ``--device cpu --image 67`` runs it on the
CPU with MPI's collectives.

Usage: ``python benchmarks/bench_multi_gpu.py [--quick] [--out DIR]
[--time-cap S] [--per-gpu-batch N] [--dry-run [--gpus N]]``;
``mpirun -n K python benchmarks/bench_multi_gpu.py --spmd [--device cpu]
[--image N] [--flat-groups]``. ``--dry-run``
needs no GPU: it parses the arguments, builds every configuration's training
graph and runs the GPU mode's rewrites (lifting, the multi-device state),
stopping before linking, and checks the row format.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cc2ops  # noqa: E402
import cc2ops.cuda  # noqa: E402
from benchmarks.common import (  # noqa: E402
    _check_row,
    base_parser,
    time_host,
    write_results,
)
from cc2ops.distributed import hybrid as mg  # noqa: E402
from cc2ops.testing.nets import StepConfig, build_step  # noqa: E402

PAPER_SPEEDUP = {1: 1.0, 2: 1.95, 4: 3.74, 8: 6.25}
PEER = "cc2ops K=1 step, same script, same run, same per-device batch"
COMM_VS_COMPUTE = (
    "per row, after the timed rows: the step compiled with the Python VM, the "
    "devices synchronised after each thunk; comm_ms_sync = collectives "
    "(GPU_COMM_OPS), compute_ms_sync = all other ops (image upload included), "
    "ms per step; rows without them: that stage failed or the time cap came"
)
NOTES = (
    "Synchronised per-op times serialise the streams (and add a launch and a "
    "sync per op), so overlap_ms = comm_ms_sync + compute_ms_sync - cc2ops_ms "
    "(the measured unsynchronised step time) on scheme (b) rows is an estimate "
    "of the overlap the real step obtains, not a measurement; the same "
    "difference on the scheme (a) row of the same K (no second stream) "
    "estimates the per-op sync overhead in it. On virtual devices broadcasts "
    "are device copies on the main stream, so no real overlap is expected."
)


class TimeCap(Exception):
    """The run's time cap (``--time-cap``) was reached."""


def configurations(n_gpus: int, quick: bool) -> list[tuple[tuple[int, ...], str, str]]:
    """``(labels, kind, scheme)`` to run, K = 1 first (the baseline).

    ``kind`` is "physical" or "virtual" (several labels on GPU 0).
    """
    ks = [1, 2] if quick else [k for k in (1, 2, 4, 8) if k <= max(n_gpus, 2)]
    runs = []
    for k in ks:
        kind = "physical" if k <= n_gpus else "virtual"
        if kind == "virtual" and k != 2:
            continue
        for scheme in ("a", "b") if k > 1 else ("a",):
            runs.append((tuple(range(k)), kind, scheme))
    return runs


def make_mode(
    labels: tuple[int, ...], kind: str, scheme: str, linker: str = "cvm"
) -> Any:
    """The GPU mode of a configuration (``cc2ops.cuda.mode(devices=...)`` for K > 1).

    ``linker="py"`` (the Python VM, whose thunk list can be wrapped) is the
    per-op breakdown's; the timed rows use ``"cvm"``.
    """
    if len(labels) == 1:
        return cc2ops.cuda.mode(labels[0], linker=linker)
    m = cc2ops.cuda.mode(
        devices=list(labels),
        linker=linker,
        comm="virtual" if kind == "virtual" else "auto",
    )
    if scheme == "b":
        m.backend.bcast_stream = "comm"  # NCCL: broadcasts on a second stream
    return m


def build(cfg, params, mode, labels, scheme, share=None, spmd=False):
    """The training step graph: ``(inputs, loss, updates, shared, velocities)``.

    :func:`cc2ops.testing.nets.build_step` of ``cfg`` (the example's net and
    momentum-SGD step, the one ``bench_step`` times) with images of any batch
    and the loss as its only output, distributed with
    ``multi_gpu.distribute(outputs, mode, scheme=scheme)`` before
    ``pytensor.grad`` when K > 1 or ``spmd``. ``share(value, name)`` makes a
    parameter (default a GPU shared variable on ``labels[0]``).
    """
    distribute = None
    if len(labels) > 1 or spmd:

        def distribute(outputs):
            return mg.distribute(outputs, mode, scheme=scheme)

    step = build_step(
        cfg,
        params,
        gpu_params=share is None,
        device=labels[0],
        static_batch=False,
        share=share,
        distribute=distribute,
        error=False,
    )
    return step.inputs, step.outputs[0], step.updates, step.params, step.velocities


def make_row(
    k: int,
    kind: str,
    scheme: str,
    per_gpu: int,
    ms: float,
    base_ms: float | None,
    compile_s: float,
    precision: str,
) -> dict[str, Any]:
    """One result row (BENCHMARK_RESULTS.md fields plus the multi-GPU ones)."""
    batch = per_gpu * k
    row: dict[str, Any] = {
        "name": f"imagenet step K={k} {kind} b{per_gpu}/gpu scheme {scheme}",
        "batch": batch,
        "per_gpu_batch": per_gpu,
        "pass": "step",
        "precision": precision,
        "cc2ops_ms": ms,
        "peer_ms": base_ms,
        "ratio": None if not base_ms else ms / base_ms,
        "gpus": k,
        "devices": kind if kind == "physical" else f"virtual ({k} labels on GPU 0)",
        "scheme": scheme,
        "images_per_s": batch / (ms / 1000.0),
        "speedup": None if not base_ms else k * base_ms / ms,
        "paper_speedup": PAPER_SPEEDUP.get(k) if kind == "physical" else None,
        "ideal_speedup": k if kind == "physical" else 1.0,
        "compile_s": compile_s,
    }
    return row


def _reset(shared: dict, velocities: dict, params: dict) -> None:
    for n, p in shared.items():
        p.set_value(np.asarray(params[n]))
        velocities[n].set_value(np.zeros_like(params[n]))


def _on_cap(signum, frame):
    raise TimeCap("time cap reached")


class SyncedSplit:
    """Communication vs other time of a Python-VM function, synchronised per thunk.

    Wraps ``fn.vm.thunks`` once (the Python VMs call them through that list,
    as in ``benchmarks/bench_step.py``): each thunk is followed by ``sync()``
    and its wall time goes to its op class; ``is_comm(op)`` says which ops
    are collectives.
    """

    def __init__(
        self, fn: Any, is_comm: Callable[[Any], bool], sync: Callable[[], None]
    ) -> None:
        vm = fn.vm
        if not hasattr(vm, "thunks") or not hasattr(vm, "nodes"):
            raise TypeError(f"SyncedSplit: {type(vm).__name__} has no thunk list")
        self.fn, self.sync = fn, sync
        self.acc: dict[str, float] = defaultdict(float)
        self.comm_classes: set[str] = set()
        for n in vm.nodes:
            if is_comm(n.op):
                self.comm_classes.add(type(n.op).__name__)
        vm.thunks = [
            self._wrap(t, type(n.op).__name__)
            for t, n in zip(vm.thunks, vm.nodes, strict=True)
        ]

    def _wrap(self, thunk: Callable, key: str) -> Callable:
        acc, sync = self.acc, self.sync

        def run() -> Any:
            t0 = time.perf_counter()
            out = thunk()
            sync()
            acc[key] += time.perf_counter() - t0
            return out

        for attr in ("inputs", "outputs", "lazy", "perform"):
            if hasattr(thunk, attr):
                setattr(run, attr, getattr(thunk, attr))
        return run

    def run(self, args: tuple, steps: int) -> dict[str, Any]:
        """Per-step ms: ``comm_ms_sync``, ``compute_ms_sync``, per comm class, wall."""
        self.fn(*args)  # warm-up: kernels loaded, pools filled
        self.sync()
        self.acc.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.fn(*args)
        self.sync()
        wall = time.perf_counter() - t0
        comm = {
            k: 1e3 * v / steps for k, v in self.acc.items() if k in self.comm_classes
        }
        other = sum(v for k, v in self.acc.items() if k not in self.comm_classes)
        return {
            "comm_ms_sync": sum(comm.values()),
            "compute_ms_sync": 1e3 * other / steps,
            "comm_ops_ms_sync": dict(sorted(comm.items())),
            "sync_step_ms": 1e3 * wall / steps,
        }


def _device_sync(labels: tuple[int, ...]) -> Callable[[], None]:
    """Synchronise the main stream of every physical device behind ``labels``.

    Enough for the scheme-(b) second stream too: a broadcast on it makes the
    main stream wait on an event recorded after it.
    """
    from cc2ops.cuda.runtime.device import get_device

    devs = {}
    for d in labels:
        dev = get_device(d)
        devs.setdefault(dev.index, dev)
    devices = list(devs.values())

    def sync() -> None:
        for dev in devices:
            dev.synchronize()

    return sync


def breakdown(
    done: list[tuple[dict[str, Any], tuple[int, ...], str, str]],
    cfg_of: Callable[[int], Any],
    steps: int,
    failures: list[str],
) -> None:
    """Add the comm vs compute fields to each measured row (module docstring).

    Never raises: a failing configuration is recorded in ``failures`` and the
    next one runs; the time cap ends the stage. A row gets its new fields only
    when its breakdown completed.
    """
    from cc2ops.cuda.ops.comm import GPU_COMM_OPS

    r = np.random.default_rng(1)
    for row, labels, kind, scheme in done:
        k = len(labels)
        try:
            cfg = cfg_of(k)
            params = cfg.init_params()
            images = r.normal(size=cfg.image_shape).astype(np.float32)
            targets = r.integers(0, cfg.classes, cfg.batch).astype("int32")
            mode = make_mode(labels, kind, scheme, linker="py")
            ins, loss, updates, _, _ = build(cfg, params, mode, labels, scheme)
            fn = pytensor.function(ins, loss, updates=updates, mode=mode)
            split = SyncedSplit(
                fn, lambda op: isinstance(op, GPU_COMM_OPS), _device_sync(labels)
            )
            got = split.run((images, targets), steps)
            got["breakdown_steps"] = steps
            if scheme == "b" and k > 1:
                got["overlap_ms"] = (
                    got["comm_ms_sync"] + got["compute_ms_sync"] - row["cc2ops_ms"]
                )
            row.update(got)
            ov = got.get("overlap_ms")
            ov_s = "" if ov is None else f"; overlap estimate {ov:.2f} ms"
            print(
                f"breakdown K={k} {kind:8s} scheme {scheme}: comm "
                f"{got['comm_ms_sync']:8.2f} ms + compute "
                f"{got['compute_ms_sync']:8.2f} ms (synchronised per op; "
                f"{got['sync_step_ms']:.2f} ms/step so) vs {row['cc2ops_ms']:.2f} "
                f"ms/step{ov_s}",
                flush=True,
            )
        except TimeCap:
            failures.append(
                "time cap reached in the comm/compute breakdown; later rows lack it"
            )
            print(failures[-1], flush=True)
            return
        except Exception as exc:  # keep the rows; note it, go on
            msg = f"breakdown K={k} {kind} scheme {scheme}: "
            msg += f"{type(exc).__name__}: {exc}"
            failures.append(msg[:2000])
            print("FAILED", msg[:2000], flush=True)


def dry_run(args, runs, cfg_of) -> None:
    """Build and rewrite every configuration without a GPU; check the row format."""
    from collections import Counter

    from pytensor.compile.rebuild import construct_function_ins_and_outs

    from cc2ops.cuda.ops.comm import GPU_COMM_OPS

    for labels, kind, scheme in runs:
        k = len(labels)
        cfg = cfg_of(k)
        params = cfg.init_params()
        mode = make_mode(labels, kind, scheme)
        t0 = time.perf_counter()
        ins, loss, updates, _, _ = build(cfg, params, mode, labels, scheme)
        i, o = construct_function_ins_and_outs(ins, loss, updates=updates)
        maker = mode.function_maker(i, o, mode)
        fg = getattr(maker, "maker", maker).fgraph
        comm = Counter(
            type(n.op).__name__
            for n in fg.apply_nodes
            if isinstance(n.op, GPU_COMM_OPS)
        )
        gpu = sum(type(n.op).__name__.startswith("Gpu") for n in fg.apply_nodes)
        print(
            f"dry-run K={k} {kind} scheme {scheme}: {len(fg.apply_nodes)} nodes, "
            f"{gpu} GPU ops, collectives {dict(comm)} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        if k > 1 and not comm:
            raise AssertionError(f"K={k}: the rewritten graph has no GPU collectives")
        py = make_mode(labels, kind, scheme, linker="py")
        if getattr(py.linker, "use_cloop", True):
            raise AssertionError(f"K={k}: the breakdown mode is not the Python VM")
        row = make_row(k, kind, scheme, cfg.batch // k, 1.0, 1.0, 0.0, "tf32")
        row.update(
            comm_ms_sync=0.4,
            compute_ms_sync=0.8,
            comm_ops_ms_sync={"GpuAllReduce": 0.4},
            sync_step_ms=1.3,
            breakdown_steps=2,
        )
        if scheme == "b":
            row["overlap_ms"] = 0.2
        _check_row(row)
    split_selfcheck()
    print("dry-run: all configurations built and rewritten; rows well-formed")


def split_selfcheck() -> None:
    """:class:`SyncedSplit` on a small CPU function in PyTensor's Python VM.

    The "collective" is the ``Sum``; checks that the wrapped thunks run, give
    the right value and that both sides of the split are timed.
    """
    from pytensor.compile.mode import Mode
    from pytensor.link.vm import VMLinker
    from pytensor.tensor.math import Sum

    x = pt.dvector("x")
    m = Mode(linker=VMLinker(use_cloop=False, c_thunks=False), optimizer="fast_run")
    fn = pytensor.function([x], pt.exp(x * 2.0).sum(), mode=m)
    syncs = []
    split = SyncedSplit(fn, lambda op: isinstance(op, Sum), lambda: syncs.append(1))
    xv = np.linspace(0.0, 1.0, 1000)
    got = split.run((xv,), 3)
    if not np.isclose(float(fn(xv)), np.exp(2.0 * xv).sum()):
        raise AssertionError("SyncedSplit: the wrapped function's value changed")
    n = len(fn.vm.nodes)
    if len(syncs) != 2 + 5 * n:  # 5 calls (warm-up, 3 steps, check), 2 bare
        raise AssertionError(f"SyncedSplit: {len(syncs)} syncs for {n} thunks")
    if not (got["comm_ms_sync"] > 0 and got["compute_ms_sync"] > 0):
        raise AssertionError(f"SyncedSplit: a side of the split is empty: {got}")
    if set(got["comm_ops_ms_sync"]) != {"Sum"}:
        raise AssertionError(f"SyncedSplit: comm classes {got['comm_ops_ms_sync']}")
    print(
        f"dry-run: SyncedSplit on a {n}-thunk CPU Python-VM function: "
        f"comm {got['comm_ms_sync']:.4f} ms, other {got['compute_ms_sync']:.4f} ms"
    )


def _median_ms(fn: Callable[[], Any], warmup: int, iters: int, sync) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def spmd_main(args, per_gpu: int, warmup: int, iters: int) -> None:
    """``--spmd``: one process per device under ``mpirun -n K`` (module notes).

    Every rank first times the plain single-device step at the per-rank batch
    (the peer), then the SPMD step of ``cc2ops.distributed.mode`` at the
    global batch ``K * per_gpu``, for schemes (a) and (b) (K = 1: scheme a).
    Correctness first: the SPMD first loss equals the mean of the
    single-device first losses of the K per-rank slices (equal slices).
    Collective time is what the ``SpmdCollective`` calls of the step took on
    each rank (``comm_ms``; the slowest rank's); ``compute_ms = cc2ops_ms -
    comm_ms``. World rank 0 writes the rows.
    """
    from mpi4py import MPI

    import cc2ops.distributed as dist
    from cc2ops.distributed.communicator import lookup

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    local = world.Split_type(MPI.COMM_TYPE_SHARED, rank).Get_rank()
    cpu = args.device == "cpu"
    if cpu:
        base = cc2ops.mode
        precision = "fp32"

        def share(value, name):
            return pytensor.shared(value, name=name)

        def sync():
            return None

    else:
        base = cc2ops.cuda.mode(local)
        precision = "tf32" if cc2ops.cuda.get_allow_tf32() else "fp32"
        share = None

        def sync():
            from cc2ops.cuda.runtime.device import initialized_devices

            for dev in initialized_devices():
                dev.synchronize()

    image = args.image
    rows, failures = [], []
    start = time.monotonic()
    cfg1 = StepConfig("imagenet", batch=per_gpu, crop=image, dropout=False)
    params = cfg1.init_params()
    r = np.random.default_rng(0)
    big = r.normal(size=(per_gpu * size, 3, image, image)).astype(np.float32)
    big_y = r.integers(0, cfg1.classes, per_gpu * size).astype("int32")
    mine = slice(rank * per_gpu, (rank + 1) * per_gpu)
    ins, loss, updates, shared, vel = build(cfg1, params, base, (local,), "a", share)
    fn1 = pytensor.function(ins, loss, updates=updates, mode=base)
    first = float(np.asarray(fn1(big[mine], big_y[mine])))
    want = float(np.mean(world.allgather(first)))
    peer_ms = float(
        np.median(_median_ms(lambda: fn1(big[mine], big_y[mine]), warmup, iters, sync))
    )
    peer_ms = max(world.allgather(peer_ms))
    schemes = ("a",) if size == 1 else ("a", "b")
    for scheme in schemes:
        try:
            t0 = time.perf_counter()
            cfg = cfg1.with_(batch=per_gpu * size)
            # the example's collectives: NCCL on the GPUs, MPI on the CPU
            mode = dist.mode(
                1 if args.flat_groups else size,
                base=base,
                collectives="mpi" if cpu else "nccl",
                device=None if cpu else local,
            )
            ins, loss, updates, shared, vel = build(
                cfg, params, mode, (local,), scheme, share, spmd=True
            )
            fn = pytensor.function(ins, loss, updates=updates, mode=mode)
            got = float(np.asarray(fn(big, big_y)))
            compile_s = time.perf_counter() - t0
            if not np.isclose(got, want, rtol=2e-3):
                raise AssertionError(
                    f"spmd K={size} scheme {scheme}: first loss {got} vs the "
                    f"single-device {want}"
                )
            # the communicators the collectives ran on (NCCL's or MPI's)
            comms = [lookup(k) for k in mode.backend.keys.values()]
            for c in comms:
                c.stats.clear()
            times = _median_ms(lambda fn=fn: fn(big, big_y), warmup, iters, sync)
            calls = warmup + iters
            comm_s = sum(s[1] for c in comms for s in c.stats.values())
            ms = max(world.allgather(float(np.median(times))))
            comm_ms = max(world.allgather(1e3 * comm_s / calls))
            row = make_row(
                size, "spmd", scheme, per_gpu, ms, peer_ms, compile_s, precision
            )
            row["name"] = f"imagenet step spmd K={size} b{per_gpu}/rank scheme {scheme}"
            row["spmd"] = True
            row["devices"] = f"{size} processes ({args.device})"
            row["paper_speedup"] = PAPER_SPEEDUP.get(size)
            row["comm_ms"] = comm_ms
            row["compute_ms"] = ms - comm_ms
            row["comm_calls_per_step"] = (
                sum(s[0] for c in comms for s in c.stats.values()) / calls
            )
            rows.append(row)
            if rank == 0:
                print(
                    f"spmd K={size} scheme {scheme}: {ms:8.2f} ms/step "
                    f"{row['images_per_s']:9.1f} img/s speedup {row['speedup']:5.2f} "
                    f"(peer {peer_ms:.2f} ms; collectives {comm_ms:.2f} ms)",
                    flush=True,
                )
        except Exception as exc:  # record it, go on with the next one
            msg = f"spmd K={size} scheme {scheme}: {type(exc).__name__}: {exc}"
            failures.append(msg[:2000])
            print("FAILED", msg[:2000], flush=True)
    if rank == 0:
        write_results(
            "multi_gpu_spmd" if not cpu else "multi_gpu_spmd_cpu",
            rows,
            "the plain single-device step at the per-rank batch, same ranks, same run",
            args.out,
            extra={
                "per_gpu_batch": per_gpu,
                "ranks": size,
                "image": image,
                "wall_s": round(time.monotonic() - start, 1),
                "failures": failures,
            },
        )


def main(argv=None) -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--spmd",
        action="store_true",
        help="one process per device: run under mpirun -n K (see spmd_main)",
    )
    p.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="--spmd's devices"
    )
    p.add_argument(
        "--image", type=int, default=224, help="--spmd: input size (67 on the CPU)"
    )
    p.add_argument(
        "--flat-groups",
        action="store_true",
        help="--spmd: groups of 1 rank (plain data parallelism across all ranks)",
    )
    p.add_argument(
        "--per-gpu-batch", type=int, default=None, help="default 128 (32 with --quick)"
    )
    p.add_argument(
        "--time-cap",
        type=float,
        default=None,
        help="seconds for the whole run (default 90 with --quick, none otherwise)",
    )
    p.add_argument("--dry-run", action="store_true", help="build graphs only, no GPU")
    p.add_argument("--gpus", type=int, default=1, help="GPUs assumed by --dry-run")
    args = p.parse_args(argv)
    per_gpu = args.per_gpu_batch or (32 if args.quick else 128)
    cap = args.time_cap if args.time_cap is not None else (90.0 if args.quick else 0)
    iters = 10 if args.quick else args.iters
    warmup = 2 if args.quick else args.warmup

    def cfg_of(k: int):
        return StepConfig("imagenet", batch=per_gpu * k, dropout=False)

    if args.spmd:
        spmd_main(args, per_gpu, warmup, iters)
        return
    if args.dry_run:
        runs = configurations(args.gpus, args.quick)
        if args.gpus == 1:
            cc2ops.cuda.set_device_map({0: 0, 1: 0})
        dry_run(args, runs, cfg_of)
        return

    start = time.monotonic()
    if cap > 0:
        signal.signal(signal.SIGALRM, _on_cap)
        signal.setitimer(signal.ITIMER_REAL, cap)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        import pycuda.driver as drv

        from cc2ops.cuda.runtime.availability import require

        require()
        n_gpus = drv.Device.count()
        runs = configurations(n_gpus, args.quick)
        if n_gpus == 1:
            cc2ops.cuda.set_device_map({0: 0, 1: 0})
        precision = "tf32" if cc2ops.cuda.get_allow_tf32() else "fp32"
        r = np.random.default_rng(0)
        base_ms: float | None = None
        ref_data: tuple | None = None
        done: list[tuple[dict[str, Any], tuple[int, ...], str, str]] = []
        for labels, kind, scheme in runs:
            k = len(labels)
            try:
                cfg = cfg_of(k)
                params = cfg.init_params()
                images = r.normal(size=cfg.image_shape).astype(np.float32)
                targets = r.integers(0, cfg.classes, cfg.batch).astype("int32")
                t0 = time.perf_counter()
                mode = make_mode(labels, kind, scheme)
                ins, loss, updates, shared, vel = build(
                    cfg, params, mode, labels, scheme
                )
                fn = pytensor.function(ins, loss, updates=updates, mode=mode)
                if k == 1:
                    # the single-device first loss of every per-device slice of
                    # the largest K's batch, each at the initial parameters
                    n = per_gpu * max(len(c[0]) for c in runs)
                    big = r.normal(size=(n, *cfg.image_shape[1:]))
                    big = big.astype(np.float32)
                    big_y = r.integers(0, cfg.classes, n).astype("int32")
                    slices = []
                    for s in range(n // per_gpu):
                        if s:
                            _reset(shared, vel, params)
                        part = slice(s * per_gpu, (s + 1) * per_gpu)
                        slices.append(float(np.asarray(fn(big[part], big_y[part]))))
                        if not s:
                            compile_s = time.perf_counter() - t0
                    ref_data = (big, big_y, slices)
                else:
                    if ref_data is None:
                        raise RuntimeError("no K=1 reference (the K=1 run failed)")
                    big, big_y, slices = ref_data
                    data = big[: per_gpu * k], big_y[: per_gpu * k]
                    got = float(np.asarray(fn(*data)))
                    compile_s = time.perf_counter() - t0
                    want = float(np.mean(slices[:k]))
                    if not np.isclose(got, want, rtol=2e-3):
                        raise AssertionError(
                            f"K={k} scheme {scheme}: first loss {got} vs the "
                            f"single-device {want}"
                        )
                    print(f"K={k} scheme {scheme}: first loss {got:.5f} = {want:.5f}")
                ms = time_host(
                    lambda fn=fn, a=images, b=targets: fn(a, b),
                    warmup=warmup,
                    iters=iters,
                )
                if k == 1:
                    base_ms = ms
                row = make_row(
                    k, kind, scheme, per_gpu, ms, base_ms, compile_s, precision
                )
                rows.append(row)
                done.append((row, labels, kind, scheme))
                sp = row["speedup"]
                print(
                    f"K={k} {kind:8s} scheme {scheme}: {ms:8.2f} ms/step "
                    f"{row['images_per_s']:9.1f} img/s speedup "
                    f"{'n/a' if sp is None else f'{sp:5.2f}'} "
                    f"(paper {PAPER_SPEEDUP.get(k) if kind == 'physical' else 'n/a'}, "
                    f"compile {compile_s:.1f} s)",
                    flush=True,
                )
            except TimeCap:
                raise
            except Exception as exc:  # record it, go on with the next one
                msg = f"K={k} {kind} scheme {scheme}: {type(exc).__name__}: {exc}"
                failures.append(msg[:2000])
                print("FAILED", msg[:2000], flush=True)
        # after every timed row: comm vs compute per step (never raises)
        breakdown(done, cfg_of, 2 if args.quick else 5, failures)
    except TimeCap:
        failures.append(
            f"time cap of {cap:.0f} s reached; later configurations skipped"
        )
        print(failures[-1], flush=True)
    except Exception as exc:
        failures.append(f"setup: {type(exc).__name__}: {exc}"[:2000])
        print("FAILED", failures[-1], flush=True)
    finally:
        if cap > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
        write_results(
            "multi_gpu",
            rows,
            PEER,
            args.out,
            extra={
                "per_gpu_batch": per_gpu,
                "paper_speedup": PAPER_SPEEDUP,
                "wall_s": round(time.monotonic() - start, 1),
                "comm_vs_compute": COMM_VS_COMPUTE,
                "notes": NOTES,
                "failures": failures,
            },
        )


if __name__ == "__main__":
    main()
