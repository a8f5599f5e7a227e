#!/usr/bin/env bash
# One command for a CUDA machine (issue 17): correctness of every LoRA kernel variant against float64, then
# compute-sanitizer (memcheck, racecheck, synccheck), then the benchmark against torch in the same run, with one
# PASS/MISS line per target in summary.txt. Everything goes to $OUT when it is set (else ./gpu-out):
#   gpu.txt gpu_tests.txt sanitizer.txt bench_lora_kernel.txt lora_kernel.md lora_kernel.json summary.txt
#   bash tests/gpu/run_all.sh [bench args, e.g. --dtype bfloat16]
# Budget: under 8 minutes on an H200 (stage limits: tests 230 s, sanitizer 3 x 35 s, benchmark 120 s; a stage
# that runs out prints a MISS line and the script goes on).
# Works without installing trtforge: a temporary folder maps the repository's folders to the trtforge.* names
# (as pyproject's package-dir does). Needs python3 with numpy + cuda-python + triton (the Triton kernel is built
# for this GPU with triton.compile) for the tests, torch for the benchmark; no TensorRT, no network. Without a GPU
# it stops after a few seconds with MISS lines and exit 2 (LORA_FORCE=1 runs every stage anyway).
# Env: PYTHON (default python3), LORA_SANITIZE=0 skips
# the sanitizer, GPU_TEST_TIMEOUT / BENCH_TIMEOUT / SANITIZE_TIMEOUT (seconds per stage / per tool).
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/trtforge/plugins"
for pair in build_engine:build_engine scheduler:scheduler profiles:profiles examples:examples; do
  ln -s "$REPO/${pair%%:*}" "$SHIM/trtforge/${pair##*:}"
done
# trtforge.plugins' __init__ imports onnx (not on the GPU machine); the GPU checks need only trtforge.plugins.lora
: > "$SHIM/trtforge/plugins/__init__.py"
ln -s "$REPO/plugins/lora" "$SHIM/trtforge/plugins/lora"
if [ "${TRTFORGE_FORCE_SHIM:-0}" = 1 ] || ! "$PY" -c "import trtforge.plugins.lora.launch" 2>/dev/null; then
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/tests/_support${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TRTFORGE_REQUIRE_GPU=1 TRITON_DEFAULT_FP_FUSION=1
OUT_DIR="${OUT:-$REPO/gpu-out}"
mkdir -p "$OUT_DIR"
export OUT="$OUT_DIR"
log() { tee "$OUT_DIR/$1"; }
summary() { echo "$1" >> "$OUT_DIR/summary.txt"; }
: > "$OUT_DIR/summary.txt"

{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c "import trtforge.plugins.lora.launch as m, sys; print('python', sys.version.split()[0], 'trtforge from', m.__file__)"
  "$PY" -c "import cuda.bindings, numpy; print('cuda-python', cuda.bindings.__version__, 'numpy', numpy.__version__)"
  "$PY" -c "import triton; print('triton', triton.__version__)"
  "$PY" -c "import torch; print('torch', torch.__version__)"
  command -v nvcc >/dev/null && nvcc --version | tail -1; } 2>&1 | log gpu.txt

T0=$SECONDS
if [ "${LORA_FORCE:-0}" != 1 ] && ! timeout 60 "$PY" -c "
from cuda.bindings import driver
assert int(driver.cuInit(0)[0]) == 0 and driver.cuDeviceGetCount()[1] > 0" >/dev/null 2>&1; then
  summary "MISS: no usable CUDA GPU here (cuInit / device count failed): nothing was measured"
  for target in "correctness of every variant vs float64" "compute-sanitizer clean" \
                "<= 6 us do_bench and <= 3 us CUDA graph up to 128 tokens (rank 16, 8 slots)" \
                ">= 10x torch's gather at 512 tokens" "<= 1.5x the bytes floor at 2048 tokens"; do
    summary "MISS: $target (not run: no GPU)"
  done
  cat "$OUT_DIR/summary.txt"
  exit 2
fi

echo "== GPU tests (every variant vs float64)"
TESTS="tests/gpu/test_lora_kernel.py tests/gpu/test_lora_triton_gpu.py tests/gpu/test_lora_prepare_gpu.py"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout "${GPU_TEST_TIMEOUT:-230}" "$PY" -m pytest $TESTS -q -rs --tb=short --maxfail=20 --durations=8 \
    -p no:cacheprovider --import-mode=importlib 2>&1 | log gpu_tests.txt
  status=${PIPESTATUS[0]}
else
  THIRD=$(( ${GPU_TEST_TIMEOUT:-230} / 3 ))  # three files in turn share the stage's limit
  { timeout "$THIRD" "$PY" tests/gpu/test_lora_kernel.py; a=$?
    timeout "$THIRD" "$PY" tests/gpu/test_lora_triton_gpu.py; b=$?
    timeout "$THIRD" "$PY" tests/gpu/test_lora_prepare_gpu.py; c=$?
    exit $(( a != 0 ? a : (b != 0 ? b : c) )); } 2>&1 | log gpu_tests.txt
  status=${PIPESTATUS[0]}
fi
T1=$SECONDS
[ "$status" = 0 ] && summary "PASS: every variant matches float64 ($((T1 - T0)) s; gpu_tests.txt)" \
  || summary "MISS: GPU correctness tests exit $status (124 = timed out; gpu_tests.txt)"

sanitize=0
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
if [ "${LORA_SANITIZE:-1}" = 1 ] && [ -n "$SAN" ]; then
  echo "== compute-sanitizer"
  : > "$OUT_DIR/sanitizer.txt"
  for tool in memcheck racecheck synccheck; do
    echo "-- $tool" | tee -a "$OUT_DIR/sanitizer.txt"
    timeout "${SANITIZE_TIMEOUT:-35}" "$SAN" --tool "$tool" --error-exitcode 9 \
      "$PY" tests/gpu/sanitize_lora.py 2>&1 | tail -n 40 | tee -a "$OUT_DIR/sanitizer.txt"
    rc=${PIPESTATUS[0]}
    echo "-- $tool exit $rc (9 = sanitizer errors, 124 = timed out)" | tee -a "$OUT_DIR/sanitizer.txt"
    [ "$rc" -ne 0 ] && sanitize=$rc
  done
  [ "$sanitize" = 0 ] && summary "PASS: compute-sanitizer memcheck/racecheck/synccheck clean" \
    || summary "MISS: compute-sanitizer exit $sanitize (sanitizer.txt)"
else
  summary "MISS: compute-sanitizer not run (not found or LORA_SANITIZE=0)"
fi
T2=$SECONDS

echo "== benchmark (ours vs torch, same run)"
timeout "${BENCH_TIMEOUT:-120}" "$PY" bench/lora_kernel.py "$@" 2>&1 | log bench_lora_kernel.txt
bench=${PIPESTATUS[0]}
T3=$SECONDS
grep -E '^- (PASS|MISS):' "$OUT_DIR/bench_lora_kernel.txt" | sed 's/^- //' >> "$OUT_DIR/summary.txt"
grep -qE '^- (PASS|MISS):' "$OUT_DIR/bench_lora_kernel.txt" || summary "MISS: benchmark printed no targets (exit $bench)"
summary "stages: tests $((T1 - T0)) s, sanitizer $((T2 - T1)) s, benchmark $((T3 - T2)) s (exit $bench); total $SECONDS s"
cat "$OUT_DIR/summary.txt"
exit $(( status != 0 ? status : (bench != 0 ? bench : sanitize) ))
