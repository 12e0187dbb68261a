#!/usr/bin/env bash
# FP8 models on the GPU (issue 23), in one call on the device machine (the environment of
# tools/gpu-session.sh: the carried wheels in .whl/, installed into /tmp/site; logs to $OUT):
#   bash tools/gpu-fp8.sh
# 1. `fused-llm build` (every package: kernelize loads them all; an unchanged one rebuilds
#    nothing), then the block-wise _scaled_mm probe's answer (fused_llm.fp8.gemm_backend);
# 2. tests/test_fp8_integration.py on CUDA (limit 240 s);
# 3. `fused-llm bench e2e --fp8 per-token --quick`, then `--fp8 block --quick` (8-layer
#    Llama-3-8B shape: prefill 4 x 2048 eager and compiled, static-cache decode batch 1,
#    agreement and numerics), each with half of what is left of the 10-minute call; the JSON /
#    CSV / PNG land in benchmarks/results/, the JSON and PNG are copied to $OUT (with the logs:
#    8 files, what the device tool brings back). E2E_ARGS adds options to both. A bench that
#    hits its limit says so: then split it over calls, E2E_ARGS="--only decode-static" (issue
#    23's decode target), then "--only prefill", then "--only agreement".
# STAGE=tests, STAGE=per-token or STAGE=block runs only that part (after the build).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE=${STAGE:-all}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -3
python3 -c "from fused_llm import fp8; print('block GEMM:', fp8.gemm_backend('cuda', 'block'))" 2>&1 | tee -a "$OUT/gpu.txt"

if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
  echo "=== tests/test_fp8_integration.py"
  timeout 240 python3 -X faulthandler -m pytest -v -p no:cacheprovider --import-mode=importlib -o addopts="" \
    tests/test_fp8_integration.py > "$OUT/test-fp8.log" 2>&1
  echo "pytest exit: $? (124: hit the 240 s limit)" | tee -a "$OUT/test-fp8.log"
  grep -E "(passed|failed|error)" "$OUT/test-fp8.log" | tail -2
  grep -E "^(FAILED|ERROR)|SKIPPED" "$OUT/test-fp8.log" | head -20
fi

schemes=()
case "$STAGE" in
  all) schemes=(per-token block) ;;
  per-token|block) schemes=("$STAGE") ;;
  tests) ;;
  *) echo "STAGE: expected all, tests, per-token or block, got $STAGE"; exit 2 ;;
esac
for i in "${!schemes[@]}"; do
  scheme=${schemes[$i]}
  LEFT=$(( (585 - SECONDS) / (${#schemes[@]} - i) ))  # an even share of what is left of the call
  echo "=== bench e2e --fp8 $scheme --quick ${E2E_ARGS:-} (limit $LEFT s)"
  timeout "$LEFT" python3 -m fused_llm_dev.cli bench e2e --fp8 "$scheme" --quick ${E2E_ARGS:-} > "$OUT/e2e-fp8-$scheme.log" 2>&1
  echo "bench exit: $? (124: hit the $LEFT s limit; split it with E2E_ARGS=\"--only ...\")" | tee -a "$OUT/e2e-fp8-$scheme.log"
  grep -vE "^(built|up to date|build )" "$OUT/e2e-fp8-$scheme.log" | tail -45
  cp benchmarks/results/e2e_fp8-"$scheme"_*.{json,png} "$OUT"/ 2>/dev/null
done
