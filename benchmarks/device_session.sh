#!/usr/bin/env bash
# One call on the lent GPU machine: stages given as arguments, each under its
# own time limit, logs and result files under $OUT (what comes back).
#
#   source .devkit/setup.sh && bash benchmarks/device_session.sh info diag:240 \
#       tests:300 cache
#
# Stages (NAME or NAME:SECONDS):
#   info        GPU, clocks, nvcc and library versions
#   diag        benchmarks/diagnose.py (host vs device time; sections $DIAG_SECTIONS,
#               default micro,step) -> logs/diagnose.json
#   diagconv    diagnose.py's per-algorithm conv section
#   new         the GPU tests named in $NEW_TESTS
#   tests       every gpu-marked test, in parallel (pytest-xdist, $JOBS workers)
#   sanitize    compute-sanitizer memcheck and racecheck on the -k sanitize tests
#               (or -k "$SANITIZE_K"), each stage with the given limit
#   conv layers step multi_gpu   the benchmarks (results to $OUT/results)
#   train       benchmarks/bench_train.py: the example's training speed against its
#               own captured step and GPU input pipeline ($TRAIN_ARGS; needs
#               nvImageCodec, the kit's gpu-data bundle, for the JPEG rows)
#   sweeppool sweepsoftmax   benchmarks/sweep_*.py (launch parameters) -> logs/
#   cache       the cubin cache (no autotune choices) as $OUT/kcache.tar.gz (bring it
#               along next time as .devkit/kcache.tar.gz: it is unpacked first)
# The cubin cache is $CC2OPS_CACHE_DIR (default /tmp/cc2ops-kcache).
set -u
OUT=${OUT:-/tmp/cc2ops-out}
L="$OUT/logs"
mkdir -p "$OUT/results" "$L"
export CC2OPS_CACHE_DIR=${CC2OPS_CACHE_DIR:-/tmp/cc2ops-kcache}
mkdir -p "$CC2OPS_CACHE_DIR"
# a cache brought along as .devkit/kcache.tar.gz or .xz (the `cache` stage of a run)
for f in .devkit/kcache.tar.gz .devkit/kcache.tar.xz; do
    [ -f "$f" ] && tar xaf "$f" -C "$CC2OPS_CACHE_DIR"
done
JOBS=${JOBS:-8}
LOG="$OUT/session.log"
t_start=$(date +%s)

say() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$LOG"; }

# the copy of the tree here may carry a stale .git: result files should name
# the commit that was measured
[ -n "${CC2OPS_COMMIT:-}" ] || say "warning: CC2OPS_COMMIT is unset; result files record git's HEAD here, which may be stale"

run_stage() {
    local name=$1 limit=$2
    shift 2
    say "== $name (limit ${limit}s)"
    timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$L/$name.log" 2>&1
    local rc=$?
    say "== $name rc=$rc"
    tail -n 25 "$L/$name.log" | sed 's/^/   /' | tee -a "$LOG" >/dev/null
}

for arg in "$@"; do
    name=${arg%%:*}
    limit=${arg#*:}
    [ "$limit" = "$arg" ] && limit=300
    case $name in
    info)
        {
            nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv
            nvcc --version | tail -2
            python3 -c "import torch, numpy, pytensor; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'numpy', numpy.__version__, 'pytensor', pytensor.__version__)"
            nproc
            ls "$CC2OPS_CACHE_DIR" | wc -l
        } >>"$LOG" 2>&1
        ;;
    diag)
        run_stage diag "$limit" python3 benchmarks/diagnose.py --sections "${DIAG_SECTIONS:-micro,step}" \
            --out "$L/diagnose.json"
        ;;
    diagconv)
        run_stage diagconv "$limit" python3 benchmarks/diagnose.py --sections conv \
            --out "$L/diagnose_conv.json"
        ;;
    new)
        run_stage new "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider \
            ${NEW_TESTS:-tests/cuda/runtime/test_cudagraph.py tests/cuda/runtime/test_profile.py}
        ;;
    tests)
        run_stage tests "$limit" python3 -m pytest -q -m gpu -n "$JOBS" \
            -p no:cacheprovider --durations=15 tests
        ;;
    sanitize)
        run_stage memcheck "$limit" compute-sanitizer --tool memcheck \
            --error-exitcode 3 python3 -m pytest -q -m gpu -k "${SANITIZE_K:-sanitize}" \
            -p no:cacheprovider tests
        run_stage racecheck "$limit" compute-sanitizer --tool racecheck \
            --error-exitcode 3 python3 -m pytest -q -m gpu -k "${SANITIZE_K:-sanitize}" \
            -p no:cacheprovider tests
        ;;
    conv)
        run_stage bench_conv "$limit" python3 benchmarks/bench_conv.py --out "$OUT/results" \
            ${CONV_ARGS:-}
        ;;
    layers)
        run_stage bench_layers "$limit" python3 benchmarks/bench_layers.py \
            --out "$OUT/results" ${LAYERS_ARGS:-}
        ;;
    sweeppool)
        run_stage sweep_pool "$limit" python3 benchmarks/sweep_pool.py \
            --out "$L/sweep_pool.json"
        ;;
    sweepsoftmax)
        run_stage sweep_softmax "$limit" python3 benchmarks/sweep_softmax.py \
            --out "$L/sweep_softmax.json"
        ;;
    step)
        run_stage bench_step "$limit" python3 benchmarks/bench_step.py \
            --out "$OUT/results" ${STEP_ARGS:-}
        ;;
    train)
        run_stage bench_train "$limit" python3 benchmarks/bench_train.py \
            --out "$OUT/results" ${TRAIN_ARGS:-}
        ;;
    multi_gpu)
        run_stage bench_multi_gpu "$limit" python3 benchmarks/bench_multi_gpu.py \
            --out "$OUT/results" ${MULTI_ARGS:-}
        ;;
    cache)
        tar czf "$OUT/kcache.tar.gz" -C "$CC2OPS_CACHE_DIR" --exclude='*.cu' \
            --exclude='autotune-*.json' . 2>>"$LOG"
        say "cache: $(ls "$CC2OPS_CACHE_DIR" | wc -l) files, $(du -sh "$OUT/kcache.tar.gz" | cut -f1)"
        ;;
    *)
        say "unknown stage $name"
        ;;
    esac
done
say "done"
# logs into one archive (a call returns at most 8 files)
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"
