#!/usr/bin/env bash
# machete-w4a16's first GPU run, in one call on the device machine (the environment of
# tools/gpu-session.sh: the carried wheels in .whl/, installed into /tmp/site; logs to $OUT):
#   bash tools/gpu-w4a16.sh
# 1. builds machete-w4a16 alone (its CUDA kernel: about 50 s) and runs its tests on CUDA plus the
#    fused_llm integration tests that need no other package's build (--noconftest: the root
#    conftest would build every package, minutes of nvcc); FULL=1 builds everything first and
#    runs the kernelize composition test too;
# 2. compute-sanitizer memcheck on the kernel tests of every kernel / tile path, racecheck on
#    the split-K CI case and the Hopper kernel's tiles and splits (partials, arrival counters,
#    the shared-memory epilogue);
# 3. the quick benchmark (`fused-llm bench machete-w4a16 --quick`: 8B QKV, 8B gate/up, 70B down
#    at 1 / 16 / 64 / 256 / 4096 tokens against cuBLAS bf16, tinygemm, torch.compile of the plain-torch
#    dequantize + F.linear, GemLite if installed).
# Each stage has a time limit; the whole takes about 7.5 minutes on an H100 (the limits add up
# to more than one 10-minute call); a stage that hits its limit says so in its log and the next
# one still runs.
# STAGE picks what runs (one 10-minute device call each; none of the last four has run yet):
#   STAGE=tests (default)   1-3 above;
#   STAGE=tune              benchmarks/tune.py, bf16, every shape and bucket (phase 2 paced to
#                           --budget-min 8), writes _tuning.py and benchmarks/results/tune_* to $OUT
#                           (copy them back and commit); TUNE_ARGS overrides the options;
#   STAGE=e2e-prefill | e2e-decode-dynamic | e2e-decode-static
#                           fused-llm bench e2e --w4a16 --quick --only <stage> (8-layer Llama-3-8B
#                           shape, bf16 eager / kernelized vs 4-bit eager / kernelized); E2E_ARGS adds options
#                           (static-cache decode compiles 4 models x 2 batches: if it hits the limit,
#                           E2E_ARGS="--batches 1", then "--batches 8").
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
export LOCAL_KERNELS="fused-llm/machete-w4a16=$PWD/machete-w4a16"
# --noconftest below: the package conftest that puts tests/ on sys.path for its helpers does not run
export PYTHONPATH=$PYTHONPATH:$PWD/machete-w4a16/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="")
if [ "${FULL:-0}" = 1 ]; then
  ( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -3
  TEST_ARGS=(machete-w4a16/tests tests/test_w4a16_integration.py tests/test_w4a16_tune.py)
else
  python3 -m fused_llm_dev.cli build machete-w4a16 2>&1 | tail -1
  TEST_ARGS=(--noconftest machete-w4a16/tests tests/test_w4a16_integration.py tests/test_w4a16_tune.py -k "not kernelize")
fi

STAGE=${STAGE:-tests}
case "$STAGE" in
tune)
  echo "=== tune.py ${TUNE_ARGS:-}"
  LEFT=$((585 - SECONDS))  # what is left of the 10-minute call after the install and the build
  timeout $LEFT python3 machete-w4a16/benchmarks/tune.py ${TUNE_ARGS:---budget-min 8} > "$OUT/tune.log" 2>&1
  echo "tune exit: $? (124: hit the $LEFT s limit; nothing written then)" | tee -a "$OUT/tune.log"
  tail -30 "$OUT/tune.log"
  cp machete-w4a16/torch-ext/machete_w4a16/_tuning.py "$OUT/" 2>/dev/null
  cp machete-w4a16/benchmarks/results/tune_* "$OUT/" 2>/dev/null
  exit 0 ;;
e2e-prefill|e2e-decode-dynamic|e2e-decode-static)
  echo "=== bench e2e --w4a16 --quick --only ${STAGE#e2e-} ${E2E_ARGS:-}"
  ( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -3
  LEFT=$((585 - SECONDS))  # the build of every package takes minutes on a fresh machine (nvcc)
  timeout $LEFT python3 -m fused_llm_dev.cli bench e2e --w4a16 --quick --only "${STAGE#e2e-}" ${E2E_ARGS:-} --out "$OUT" \
    > "$OUT/e2e-w4a16-$STAGE.log" 2>&1
  echo "e2e exit: $? (124: hit the $LEFT s limit; run the stage again on the warm machine, the build is kept)" \
    | tee -a "$OUT/e2e-w4a16-$STAGE.log"
  tail -40 "$OUT/e2e-w4a16-$STAGE.log"
  exit 0 ;;
tests) ;;
*) echo "STAGE: expected tests, tune, e2e-prefill, e2e-decode-dynamic or e2e-decode-static, got $STAGE"; exit 2 ;;
esac

echo "=== tests"
timeout 200 "${PYTEST[@]}" -v "${TEST_ARGS[@]}" > "$OUT/test-w4a16.log" 2>&1
echo "pytest exit: $? (124: hit the 200 s limit)" | tee -a "$OUT/test-w4a16.log"
grep -E "(passed|failed|error)" "$OUT/test-w4a16.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/test-w4a16.log" | head -20

echo "=== compute-sanitizer"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q --noconftest machete-w4a16/tests/test_w4a16.py \
  -k "mma_after or w4a16_gemm_ci or tile_configs or k_off or non_contiguous or bias_and_act_order or cuda_graph or (wgmma_kernel and bfloat16) or wgmma_inputs" > "$OUT/sanitize-memcheck.log" 2>&1
echo "compute-sanitizer memcheck exit: $? (9: errors found, 124: hit the 150 s limit)" | tee -a "$OUT/sanitize-memcheck.log"
tail -4 "$OUT/sanitize-memcheck.log"
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q --noconftest machete-w4a16/tests/test_w4a16.py \
  -k "w4a16_gemm_ci or (wgmma_kernel and bfloat16 and 128-False)" > "$OUT/sanitize-racecheck.log" 2>&1
echo "compute-sanitizer racecheck exit: $?" | tee -a "$OUT/sanitize-racecheck.log"
tail -3 "$OUT/sanitize-racecheck.log"

echo "=== benchmark (quick)"
timeout 240 python3 -m fused_llm_dev.cli bench machete-w4a16 --quick --out "$OUT" > "$OUT/bench-quick.log" 2>&1
echo "bench exit: $? (124: hit the 240 s limit)" | tee -a "$OUT/bench-quick.log"
tail -40 "$OUT/bench-quick.log"
