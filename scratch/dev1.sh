set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -1
PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)
echo "=== tests"
timeout 170 "${PYTEST[@]}" -q -x skinny-gemm/tests > "$OUT/test-skinny.log" 2>&1
echo "pytest exit: $?"; tail -15 "$OUT/test-skinny.log" | cut -c1-300
echo "=== tune 405B qkv"
timeout 230 python3 skinny-gemm/benchmarks/tune.py --dry-run --shapes 405B-tp8-qkv --tokens 1,16 > "$OUT/tune.log" 2>&1
echo "tune exit $?"; grep -v "^ " "$OUT/tune.log" | grep -v "^{" | head -30
echo "=== bench quick"
timeout 130 python3 -m fused_llm_dev.cli bench skinny-gemm --quick --providers ours,ours_atomic,linear,cublas,read_floor --out "$OUT" > "$OUT/bench-quick.log" 2>&1
echo "bench exit $?"; tail -40 "$OUT/bench-quick.log"
