set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -3
export FUSED_LLM_SKIP_BUILD=1
PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="")
echo "=== swiglu serial rerun (OOM under xdist before)"
timeout 90 "${PYTEST[@]}" -q swiglu-fp8/tests/test_swiglu_fp8.py -k "test_static_fp8 or test_dynamic_fp8" 2>&1 | tail -2
echo "=== fp8 + kernelize tests"
python3 -c "from fused_llm import fp8; print('block GEMM:', fp8.gemm_backend('cuda', 'block'))"
timeout 150 "${PYTEST[@]}" -q -n 8 tests/test_fp8_integration.py tests/test_kernelize.py > "$OUT/test-fp8.log" 2>&1
echo "pytest exit: $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test-fp8.log" | head -15 | cut -c1-250
echo "=== machete tests + memcheck/racecheck"
timeout 100 "${PYTEST[@]}" -q -n 8 machete-w4a16/tests/test_w4a16.py > "$OUT/test-w4a16.log" 2>&1
echo "pytest exit: $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test-w4a16.log" | head -8 | cut -c1-250
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q machete-w4a16/tests/test_w4a16.py -k "tile_configs and splitk" > "$OUT/w4-memcheck.log" 2>&1
echo "memcheck exit $?"; tail -2 "$OUT/w4-memcheck.log"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q machete-w4a16/tests/test_w4a16.py -k "tile_configs and splitk and M1" > "$OUT/w4-racecheck.log" 2>&1
echo "racecheck exit $?"; tail -2 "$OUT/w4-racecheck.log"
echo "=== fp8 decode quick"
timeout 150 python3 -m fused_llm_dev.cli bench e2e --fp8 per-token --only decode-static --quick --out "$OUT" > "$OUT/e2e-fp8.log" 2>&1
echo "exit $?"; tail -25 "$OUT/e2e-fp8.log"
