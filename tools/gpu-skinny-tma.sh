#!/usr/bin/env bash
# skinny-gemm's compiled Hopper kernel (TmaConfig, csrc/skinny_tma.cu) on the device machine, in
# one call (the environment of tools/gpu-session.sh: the carried wheels in .whl/, installed
# into /tmp/site; logs to $OUT):
#   bash tools/gpu-skinny-tma.sh [tune]
# 1. builds skinny-gemm for this GPU (its CUDA variant: the binding and the kernel, sm_90) and
#    runs the kernel's tests (values against fp64 at the shapes and off-tile ones, every
#    compiled launch, layouts, bad input, determinism, opcheck, compile, CUDA graphs) and the
#    package's other tests (the dispatch with TMA entries included);
# 2. compute-sanitizer memcheck and racecheck on the kernel's value tests (TMA ring, partial
#    slots, arrival counters);
# 3. the bf16 sweep of tune.py at 1-16 tokens on the Llama-405B TP8 QKV shape and the 8B ones,
#    printed, not written (`tune` as the first argument writes the table instead: commit it
#    with the log), and the quick benchmark with the ours_tma provider against cuBLAS.
# Each stage has a time limit, so the whole stays under 9 minutes on an H100.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -3 | tee "$OUT/build.log"

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)

echo "=== tests"
timeout 200 "${PYTEST[@]}" -q skinny-gemm/tests > "$OUT/test-skinny.log" 2>&1
echo "pytest exit: $? (124: hit the 200 s limit)" | tee -a "$OUT/test-skinny.log"
grep -E "(passed|failed|error)" "$OUT/test-skinny.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/test-skinny.log" | head -20

echo "=== compute-sanitizer"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_tma.py \
  -k "every_compiled_config or layouts or values and 1000" > "$OUT/sanitize-memcheck.log" 2>&1
echo "memcheck exit: $? (9: errors, 124: hit the limit)" | tee -a "$OUT/sanitize-memcheck.log"
tail -3 "$OUT/sanitize-memcheck.log"
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_tma.py \
  -k "every_compiled_config" > "$OUT/sanitize-racecheck.log" 2>&1
echo "racecheck exit: $? (9: hazards, 124: hit the limit)" | tee -a "$OUT/sanitize-racecheck.log"
tail -3 "$OUT/sanitize-racecheck.log"

echo "=== tune (bf16, 1-16 tokens)"
write=--no-write; [ "${1:-}" = tune ] && write=
timeout 150 python3 skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 1,2,4,8,16 \
  --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down $write > "$OUT/tune-tma.log" 2>&1
echo "tune exit: $?" | tee -a "$OUT/tune-tma.log"
grep -E "M=|wrote" "$OUT/tune-tma.log"
[ -z "$write" ] && cp skinny-gemm/torch-ext/skinny_gemm/_tuning.py "$OUT/"

echo "=== benchmark (quick)"
timeout 90 python3 -m fused_llm_dev.cli bench skinny-gemm --quick --providers ours,ours_tma,linear,cublas,read_floor \
  --out "$OUT" > "$OUT/bench-quick.log" 2>&1
echo "bench exit: $?" | tee -a "$OUT/bench-quick.log"
tail -30 "$OUT/bench-quick.log"
