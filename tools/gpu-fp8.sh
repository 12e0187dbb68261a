#!/usr/bin/env bash
# FP8 models' first GPU run (issue 23), in calls on the device machine (the environment of
# tools/gpu-session.sh: the carried wheels in .whl/, installed into /tmp/site; logs to $OUT):
#   STAGE=tests   bash tools/gpu-fp8.sh    # build every package (kernelize loads them all), FP8 tests on CUDA
#   STAGE=prefill SCHEME=per-token bash tools/gpu-fp8.sh    # bench e2e --fp8 per-token --only prefill
#   STAGE=decode  SCHEME=per-token bash tools/gpu-fp8.sh    # --only decode-static
#   STAGE=agree   SCHEME=per-token bash tools/gpu-fp8.sh    # --only agreement (and the numerics table)
# and the same three with SCHEME=block. Each bench stage is one `fused-llm bench e2e --fp8`
# call (Llama-3-8B shape, 8 layers), kept under the 10-minute limit of one call by a timeout;
# the JSON / CSV / PNG land in benchmarks/results/ and are copied to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE=${STAGE:-tests}; SCHEME=${SCHEME:-per-token}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -3   # an unchanged package rebuilds nothing

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="")
case "$STAGE" in
  tests)
    # does torch._scaled_mm take the block scheme's scales here? (the block GEMM falls back otherwise)
    python3 -c "import torch; from fused_llm import fp8; print('block GEMM:', fp8.gemm_backend('cuda', 'block'))" | tee -a "$OUT/gpu.txt"
    timeout 400 "${PYTEST[@]}" -v tests/test_fp8_integration.py tests/test_kernelize.py > "$OUT/test-fp8.log" 2>&1
    echo "pytest exit: $? (124: hit the 400 s limit)" | tee -a "$OUT/test-fp8.log"
    grep -E "(passed|failed|error)" "$OUT/test-fp8.log" | tail -2
    grep -E "^(FAILED|ERROR)" "$OUT/test-fp8.log" | head -20
    ;;
  prefill|decode|agree)
    only=$([ "$STAGE" = prefill ] && echo prefill || ([ "$STAGE" = decode ] && echo decode-static || echo agreement))
    timeout 560 python3 -m fused_llm_dev.cli bench e2e --fp8 "$SCHEME" --only "$only" ${QUICK:+--quick} > "$OUT/e2e-fp8-$SCHEME-$only.log" 2>&1
    echo "bench exit: $? (124: hit the 560 s limit)" | tee -a "$OUT/e2e-fp8-$SCHEME-$only.log"
    tail -60 "$OUT/e2e-fp8-$SCHEME-$only.log"
    cp benchmarks/results/e2e_fp8-"$SCHEME"_* "$OUT"/ 2>/dev/null
    ;;
  *) echo "STAGE: expected tests, prefill, decode or agree, got $STAGE"; exit 2 ;;
esac
