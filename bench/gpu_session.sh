#!/usr/bin/env bash
# Every GPU check in one run of at most ten minutes (about five expected) on one GPU: the GPU tests, every model's throughput
# against transformers (eager and compiled), the live webcam path, and a training step. Results (logs and
# JSON) go to $OUT, or ./gpu-results.
#
# The machine needs Python with torch (CUDA), transformers with Sapiens2 (5.23 or later), safetensors,
# huggingface_hub, accelerate, opencv, pillow and pytest. Wheels of anything missing can be put in .whl/ of
# the repository: they are installed first, without their dependencies and without the network.
#
#     bash bench/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 YOLO_OFFLINE=1 PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$OUT/gpu.txt"

status=0
timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" || status=1
timeout 300 "$PYTHON" bench/bench_cuda.py --compile --live --json "$OUT/bench_cuda.json" 2>&1 \
    | tee "$OUT/bench_cuda.log" || status=1
timeout 150 "$PYTHON" -m bench.bench_train_cuda 2>&1 | tee "$OUT/bench_train_cuda.log" || status=1
# Ahead-of-time compiled blocks (the ZeroGPU start-up's path) against eager, 0.4b and 1b at batches 1 and 4.
timeout 240 "$PYTHON" bench/bench_aot_cuda.py --json "$OUT/bench_aot_cuda.json" 2>&1 \
    | tee "$OUT/bench_aot_cuda.log" || status=1
exit $status
