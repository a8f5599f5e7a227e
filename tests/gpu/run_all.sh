#!/usr/bin/env bash
# One command for a CUDA machine: the GPU tests, then the LoRA kernel benchmark, then compute-sanitizer on small
# launches (memcheck, racecheck, synccheck) when compute-sanitizer exists. Each stage has a time limit and its own
# log; a failing stage does not stop the next one. Results also go to $OUT when it is set:
#   gpu.txt gpu_tests.txt bench_lora_kernel.txt lora_kernel.md lora_kernel.json sanitizer.txt summary.txt
#   bash tests/gpu/run_all.sh [bench args, e.g. --dtype bfloat16]
# Works without installing trtforge: a temporary folder maps the repository's folders to the trtforge.* names
# (as pyproject's package-dir does). Needs python3 with numpy + cuda-python (+ nvcc or libnvrtc) for the tests,
# torch + triton for the benchmark; no TensorRT, no network. Env: PYTHON (default python3), LORA_SANITIZE=0 skips
# the sanitizer, GPU_TEST_TIMEOUT / BENCH_TIMEOUT / SANITIZE_TIMEOUT (seconds per stage / per tool).
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/trtforge"
for pair in plugins:plugins build_engine:build_engine scheduler:scheduler profiles:profiles examples:examples; do
  ln -s "$REPO/${pair%%:*}" "$SHIM/trtforge/${pair##*:}"
done
if [ "${TRTFORGE_FORCE_SHIM:-0}" = 1 ] || ! "$PY" -c "import trtforge.plugins.lora.launch" 2>/dev/null; then
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/tests/_support${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TRTFORGE_REQUIRE_GPU=1
OUT_DIR="${OUT:-}"
[ -n "$OUT_DIR" ] && mkdir -p "$OUT_DIR"
log() { if [ -n "$OUT_DIR" ]; then tee "$OUT_DIR/$1"; else cat; fi; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c "import trtforge.plugins.lora.launch as m, sys; print('python', sys.version.split()[0], 'trtforge from', m.__file__)"
  "$PY" -c "import cuda.bindings, numpy; print('cuda-python', cuda.bindings.__version__, 'numpy', numpy.__version__)"
  command -v nvcc >/dev/null && nvcc --version | tail -1; } 2>&1 | log gpu.txt

T0=$SECONDS
echo "== GPU tests"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout "${GPU_TEST_TIMEOUT:-400}" "$PY" -m pytest tests/gpu -q -rs --tb=short --maxfail=10 --durations=8 \
    -p no:cacheprovider --import-mode=importlib 2>&1 | log gpu_tests.txt
  status=${PIPESTATUS[0]}
else
  timeout "${GPU_TEST_TIMEOUT:-400}" "$PY" tests/gpu/test_lora_kernel.py 2>&1 | log gpu_tests.txt
  status=${PIPESTATUS[0]}
fi

T1=$SECONDS
echo "== benchmark"
timeout "${BENCH_TIMEOUT:-300}" "$PY" bench/lora_kernel.py "$@" 2>&1 | log bench_lora_kernel.txt
bench=${PIPESTATUS[0]}

T2=$SECONDS
sanitize=0
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
if [ "${LORA_SANITIZE:-1}" = 1 ] && [ -n "$SAN" ]; then
  echo "== compute-sanitizer"
  SAN_LOG="$SHIM/sanitizer.txt"
  for tool in memcheck racecheck synccheck; do
    echo "-- $tool" | tee -a "$SAN_LOG"
    timeout "${SANITIZE_TIMEOUT:-90}" "$SAN" --tool "$tool" --error-exitcode 9 \
      "$PY" tests/gpu/sanitize_lora.py 2>&1 | tail -n 40 | tee -a "$SAN_LOG"
    rc=${PIPESTATUS[0]}
    echo "-- $tool exit $rc (9 = sanitizer errors, 124 = timed out)" | tee -a "$SAN_LOG"
    [ "$rc" -ne 0 ] && sanitize=$rc
  done
  [ -n "$OUT_DIR" ] && cp "$SAN_LOG" "$OUT_DIR/sanitizer.txt"
fi
echo "gpu tests exit $status ($((T1 - T0)) s), bench exit $bench ($((T2 - T1)) s), sanitizer ${sanitize} ($((SECONDS - T2)) s; 0 = clean or not run)" | log summary.txt
exit $(( status != 0 ? status : (bench != 0 ? bench : sanitize) ))
