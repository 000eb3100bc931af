#!/usr/bin/env bash
# Every GPU check in one run of about eight minutes on one GPU, most important first: the GPU tests, every
# model's throughput against transformers (eager and compiled) with the live webcam path, the ahead-of-time
# compiled blocks (where a probe finds AOTInductor working at all), and training steps. Each step has its own
# time limit (800 s if every one ran out), so one slow step cannot take the others' time, and its log is
# written as it goes. Results (logs and JSON) go to $OUT, or ./gpu-results.
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
export HF_HUB_OFFLINE=1 YOLO_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 GRADIO_ANALYTICS_ENABLED=False

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$OUT/gpu.txt"

status=0
timeout 100 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" || status=1
timeout 200 "$PYTHON" bench/bench_cuda.py --compile --iterations 10 \
    --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.log" || status=1
# The live webcam path in a step of its own: after the compiled pose model's compiles (about 2 minutes) the
# step above has no time left for it.
timeout 150 "$PYTHON" bench/bench_cuda.py --kinds "" --compile --live --live-seconds 5 \
    --json "$OUT/bench_live.json" 2>&1 | tee "$OUT/bench_live.log" || status=1
# Ahead-of-time compiled blocks (the ZeroGPU start-up's path) against eager, 0.4b at batches 1 and 4, with
# the blocks' own tensors as the programs' weights (the app's way), then with copies the programs own; only
# where torch's AOTInductor loads a package at all (the probe: one linear layer, about 40 s).
if timeout 90 "$PYTHON" bench/aot_probe.py 2>&1 | tee "$OUT/aot_probe.log"; then
    timeout 110 "$PYTHON" bench/bench_aot_cuda.py --sizes 0.4b --json "$OUT/bench_aot_cuda.json" 2>&1 \
        | tee "$OUT/bench_aot_cuda.log" || status=1
    timeout 80 "$PYTHON" bench/bench_aot_cuda.py --sizes 0.4b --copied-constants \
        --json "$OUT/bench_aot_copied.json" 2>&1 | tee "$OUT/bench_aot_copied.log" || status=1
else
    echo "AOTInductor does not work in this torch build: the ahead-of-time benchmarks are skipped." \
        | tee -a "$OUT/aot_probe.log"
    status=1
fi
timeout 70 "$PYTHON" -m bench.bench_train_cuda --steps 5 2>&1 | tee "$OUT/bench_train_cuda.log" || status=1
exit $status
