#!/usr/bin/env bash
# One command for a CUDA machine: the GPU tests, then the LoRA kernel benchmark.
#   bash tests/gpu/run_all.sh            (results also go to $OUT when it is set)
# Works without installing trtforge: a temporary folder maps the repository's folders to the trtforge.* names
# (as pyproject's package-dir does). Needs numpy + cuda-python (+ nvcc or libnvrtc) for the tests, torch + triton
# for the benchmark; no TensorRT, no network.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/trtforge"
for pair in plugins:plugins build_engine:build_engine scheduler:scheduler profiles:profiles examples:examples; do
  ln -s "$REPO/${pair%%:*}" "$SHIM/trtforge/${pair##*:}"
done
if ! python -c "import trtforge.plugins.lora.launch" 2>/dev/null; then
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/tests/_support${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-}"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | tee ${OUT_DIR:+"$OUT_DIR/gpu.txt"}
if python -c "import pytest" 2>/dev/null; then
  python -m pytest tests/gpu -q -rs -p no:cacheprovider --import-mode=importlib \
    ${OUT_DIR:+--junitxml "$OUT_DIR/gpu_tests.xml"} 2>&1 | tee ${OUT_DIR:+"$OUT_DIR/gpu_tests.txt"}
  status=${PIPESTATUS[0]}
else
  python tests/gpu/test_lora_kernel.py 2>&1 | tee ${OUT_DIR:+"$OUT_DIR/gpu_tests.txt"}
  status=${PIPESTATUS[0]}
fi
python bench/lora_kernel.py "$@" 2>&1 | tee ${OUT_DIR:+"$OUT_DIR/bench_lora_kernel.txt"}
bench=${PIPESTATUS[0]}
echo "gpu tests exit $status, bench exit $bench"
exit $(( status != 0 ? status : bench ))
