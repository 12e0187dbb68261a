set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -1
PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)
echo "=== tests"
timeout 200 "${PYTEST[@]}" -q -n 6 skinny-gemm/tests > "$OUT/test-skinny.log" 2>&1
echo "pytest exit: $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test-skinny.log" | head -20 | cut -c1-300
grep -E "^E  .*Error" "$OUT/test-skinny.log" | sort | uniq -c | head
echo "=== explore"
timeout 150 python3 scratch/explore2.py fp8 2>&1 | tee $OUT/explore2_fp8.log
timeout 230 python3 scratch/explore2.py bf16 2>&1 | tee $OUT/explore2_bf16.log
