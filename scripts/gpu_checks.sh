#!/usr/bin/env bash
# The checks that need a CUDA GPU (CI has none): every test skipped without CUDA, then the GPU
# benchmarks (docs/performance.md). Run from the repository root on a GPU machine:
#
#     OUT=/tmp/gpu scripts/gpu_checks.sh
#
# Writes OUT/gpu.txt (device, driver, torch), OUT/tests.log, OUT/bench_gpu.{log,json} and
# OUT/bench_async.{log,json} (background checkpoint saves of a 100M model trained on the GPU)
# and OUT/cuda_sync.log (device syncs per step the Trainer adds to a raw loop).
# Exits non-zero when a test failed. Packages the image lacks can be installed first from
# wheels in .whl/ (blake3, torchao for fp8, deepspeed and its pydantic/hjson) into a folder on
# PYTHONPATH: `pip install --no-index --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site`.
set -o pipefail
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"

$PY -m pytest -p no:cacheprovider -q -rsx --durations=12 \
    tests/gpu tests/precision/test_fp8.py tests/callbacks/test_throughput.py \
    tests/callbacks/test_device_stats.py tests/test_big_modeling.py \
    tests/test_accelerator_plugins.py 2>&1 | tee "$OUT/tests.log"
status=$?

$PY -m benchmarks.bench_gpu --steps ${GPU_BENCH_STEPS:-200} --rounds ${GPU_BENCH_ROUNDS:-3} \
    --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
# A GPU step of this model takes ~5 ms: a save every 200 steps leaves the writer ~1 s.
$PY -m benchmarks.bench_async_checkpoint --accelerator cuda --params 100e6 --steps 1000 \
    --every 200 --rounds 2 --json "$OUT/bench_async.json" 2>&1 | tee "$OUT/bench_async.log"
$PY scripts/cuda_sync_check.py --config default --steps 20 2>&1 | tee "$OUT/cuda_sync.log"
exit $status
