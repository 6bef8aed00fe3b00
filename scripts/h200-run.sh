#!/usr/bin/env bash
# The H200 run behind results/ (through the device tool; see ../shared/device/README.md):
#   carry [".gl", ".whl"], command: bash scripts/h200-run.sh
# Writes result runs and logs under $OUT (at most 8 files come back).
set -u
source .gl/device-env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-out}; mkdir -p "$out/b" "$out/q" "$out/v"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt" 2>&1
# bench: the model-like sizes issue 7 targets, with peaks and the PyTorch CUDA peer
timeout ${BENCH_S:-300} python3 -m kbench bench --peer torch --quiet --out "$out/b" \
  -k "size=268435456" -k "size=16777216" -k "matmul[m=4096" -k "matmul[m=8192" \
  -k "dtype=Q4_0]" -k "dtype=Q8_0]" -k "dtype=Q4_K]" -k "dtype=Q6_K]" \
  -k "attention[" -k "issue_rate" -k "copy_buffer[" -k "copy_roundtrip" > "$out/bench.log" 2>&1
tail -4 "$out/bench.log"
# queue configurations: one queue, several queues of a family, one per compute family, async
timeout ${QUEUE_S:-60} python3 -m kbench bench -q all --no-peaks --quiet --out "$out/q" \
  -k "add[size=16777216]" -k "matmul[m=1024" -k "kp_mult[size=16777216]" >> "$out/bench.log" 2>&1
tail -3 "$out/bench.log"
timeout ${VALIDATE_S:-100} python3 -m kbench validate -q all --quiet --out "$out/v" > "$out/validate.log" 2>&1
tail -5 "$out/validate.log"
KBENCH_VALIDATION=1 timeout ${TESTS_S:-90} python3 -m pytest tests/test_runtime_kompute.py tests/test_runtime_fixes.py \
  tests/test_runtime_lifetimes.py tests/test_runtime_device.py tests/test_vulkan_backend.py -q -rs -p no:cacheprovider \
  > "$out/tests.log" 2>&1
tail -4 "$out/tests.log"
