"""One process of the SPMD equivalence tests (run under ``mpirun``, or alone).

Trains the example's ImageNet layout (``examples/imagenet/nets.py``, tiny
widths, 67x67 inputs, dropout on) for a few momentum-SGD steps with the
example's update rule and writes, from world rank 0, the losses and the final
parameters, momenta and dropout states to ``OUT/result.npz``. Without
``--spmd`` it is the single-process single-device reference.

Options: ``--spmd`` (``cc2ops.distributed.mode``), ``--scheme a|b``,
``--group-size G``, ``--batch B``, ``--steps N``, ``--first-step S`` (the
data of steps S..S+N-1), ``--resume FILE`` (a checkpoint of
``cc2ops.distributed.checkpoint``), ``--save FILE`` (one after the steps),
``--fail-rank R`` (rank R raises before its first step), ``--stall-rank R``
(rank R never joins its first step), ``--timeout T`` (set-up and compile),
``--step-timeout T`` (the steps' collectives), ``--device cuda`` (the
ranks' graphs in ``cc2ops.cuda.mode`` on the local rank's GPU),
``--collectives nccl`` and ``--keep-trivial`` (one-rank collectives still go
through the communicator), ``--tiny`` (one conv and one FC layer instead of the net).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "imagenet"))

import numpy as np  # noqa: E402


def build(args):
    import pytensor
    import pytensor.tensor as pt

    import cc2ops
    import nets
    from cc2ops.distributed import checkpoint, hybrid

    net = nets.Network("imagenet", 10, 67, width_mult=1 / 32)
    values = net.init_params([0, 1])
    if args.tiny:  # one conv, one FC layer: compiles fast (the failure tests)
        r = np.random.default_rng(0)
        values = {
            "conv.W": (r.normal(size=(2, 3, 3, 3)) * 0.1).astype("float32"),
            "fc.W": (r.normal(size=(2 * 17 * 17, 10)) * 0.01).astype("float32"),
            "fc.b": np.zeros(10, "float32"),
        }
    f32 = np.float32
    params = {n: pytensor.shared(v, name=n) for n, v in values.items()}
    momenta = {
        n: pytensor.shared(np.zeros_like(v), name="v:" + n) for n, v in values.items()
    }
    states = {} if args.tiny else net.make_dropout_states([0, 2])
    step0 = 0
    if args.resume:
        saved = checkpoint.load(args.resume)
        for name, var in [*params.items(), *momenta.items(), *states.items()]:
            key = var.name or name
            var.set_value(saved[key])
        step0 = int(saved["step"])
    with pytensor.config.change_flags(floatX="float32"):
        x = pt.tensor4("images", dtype="float32")
        y = pt.ivector("labels")
        if args.tiny:
            h = cc2ops.conv2d(x, params["conv.W"], stride=4)
            logits = pt.dot(h.flatten(2), params["fc.W"]) + params["fc.b"]
        else:
            logits = net.forward(x, params, train=True, dropout_states=states)
        loss = cc2ops.softmax_cross_entropy(logits, y).mean()
        err = cc2ops.top_k_error(logits, y, k=1).mean()
        base = cc2ops.mode
        if args.device == "cuda":
            from cc2ops import cuda

            base = cuda.mode(device=local_rank())
        if args.spmd:
            from cc2ops import distributed

            mode = distributed.mode(
                args.group_size,
                timeout=args.timeout,
                base=base,
                collectives=args.collectives,
                keep_trivial=args.keep_trivial,
            )
            loss, err = hybrid.distribute([loss, err], mode, scheme=args.scheme)
        else:
            mode = base
        names = list(values)
        grads = pytensor.grad(loss, [params[n] for n in names])
        updates = []
        for name, g in zip(names, grads, strict=True):
            p, v = params[name], momenta[name]
            if name.endswith(".W"):
                g = g + f32(5e-4) * p
            v_new = f32(0.9) * v - f32(0.01) * g
            updates += [(v, v_new), (p, p + v_new)]
        fn = pytensor.function([x, y], [loss, err], updates=updates, mode=mode)
    return fn, params, momenta, states, step0, mode


def local_rank() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0))


def data(step, batch):
    r = np.random.default_rng([7, step])
    xs = r.normal(size=(batch, 3, 67, 67)).astype("float32")
    ys = r.integers(0, 10, size=batch).astype("int32")
    return xs, ys


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--spmd", action="store_true")
    p.add_argument("--scheme", default="a")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=7)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--resume", default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--step-timeout", type=float, default=None)
    p.add_argument("--stall-rank", type=int, default=None)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--collectives", default="mpi", choices=["mpi", "nccl"])
    p.add_argument("--keep-trivial", action="store_true")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", 0)))
    from cc2ops.distributed import checkpoint, guard

    try:
        with guard():
            fn, params, momenta, states, step0, mode = build(args)
            if args.step_timeout is not None:
                mode.topology.set_timeout(args.step_timeout)
            if args.fail_rank is not None and rank == args.fail_rank:
                raise RuntimeError(f"rank {rank} fails on purpose")
            if args.stall_rank is not None and rank == args.stall_rank:
                time.sleep(120)  # stuck: never joins the first collective
            losses = []
            t0 = time.monotonic()
            for step in range(step0, step0 + args.steps):
                loss, err = fn(*data(step, args.batch))
                losses.append([float(loss), float(err)])
            elapsed = time.monotonic() - t0
            named = [*params.values(), *momenta.values(), *states.values()]
            if args.save:
                checkpoint.save(args.save, named, step=step0 + args.steps)
            values = {v.name: np.asarray(v.get_value()) for v in named}
            if rank == 0:
                np.savez(
                    out / "result.npz",
                    losses=np.asarray(losses),
                    elapsed=elapsed,
                    **values,
                )
    except Exception as e:  # noqa: BLE001 - reported to the test through a file
        (out / f"error{rank}.txt").write_text(
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        )
        sys.stdout.flush()
        from cc2ops.distributed import CommError

        if not isinstance(e, CommError):
            time.sleep(5)  # this rank failed first: let the others report it
        os._exit(3)


if __name__ == "__main__":
    main()
