#!/usr/bin/env bash
# skinny-gemm's compiled tensor-core GEMV (MmaConfig, csrc/skinny_mma*.cu) on the device machine,
# in one call (the environment of tools/gpu-session.sh: the carried wheels in .whl/, installed into
# /tmp/site; logs to $OUT):
#   bash tools/gpu-skinny-mma.sh [stage ...]      stages: test tma-test tune sanitize (default: all)
# build   always: skinny-gemm for this GPU (its CUDA variant: both compiled kernels);
# test    the GEMV's tests (bf16 / fp16 and FP8 values against fp64, every compiled launch,
#         layouts, bad input, determinism, opcheck, compile, CUDA graphs) and the other test
#         files' configuration, dispatch, bad-input and table tests;
# tma-test the compiled Hopper kernel's tests (it shares skinny_device.cuh and the binding's
#         checks with the GEMV);
# tune    tune.py in a layer at $TUNE_TOKENS (default 1,2,4,8,16) on $TUNE_SHAPES (default
#         405B-tp8-qkv,8B-qkv) for $TUNE_DTYPES (default bfloat16), writing the table ($OUT/_tuning.py);
# sanitize compute-sanitizer memcheck (bf16 and FP8 values at the off-tile shapes, both loops, layouts,
#         the binding's checks) and racecheck (the staged ring, the warps' and a cluster's sums) on the
#         GEMV's tests.
# Every stage's limit is cut to the time left before a $DEADLINE s deadline (default 540; the
# call's limit is 600).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-540}
limit() { local left=$((DEADLINE - SECONDS)); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
STAGES=("$@"); [ ${#STAGES[@]} -eq 0 ] && STAGES=(test tma-test tune sanitize)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
timeout "$(limit 200)" python3 -m fused_llm_dev.cli build skinny-gemm > "$OUT/build.log" 2>&1
echo "build exit $? at ${SECONDS}s"; tail -2 "$OUT/build.log"

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)
for stage in "${STAGES[@]}"; do
  case $stage in
    test)
      timeout "$(limit 200)" "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_mma.py > "$OUT/test_mma.log" 2>&1
      echo "GEMV tests exit $? at ${SECONDS}s"; tail -1 "$OUT/test_mma.log"; grep -E "^(FAILED|ERROR)" "$OUT/test_mma.log" | head -8
      timeout "$(limit 60)" "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_gemm.py \
        -k "config or dispatch or bad_input or table or linear_fp8" > "$OUT/test_other.log" 2>&1
      echo "other tests exit $? at ${SECONDS}s"; tail -1 "$OUT/test_other.log"; grep -E "^(FAILED|ERROR)" "$OUT/test_other.log" | head -5 ;;
    tma-test)
      timeout "$(limit 150)" "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_tma.py > "$OUT/test_tma.log" 2>&1
      echo "TMA tests exit $? at ${SECONDS}s"; tail -1 "$OUT/test_tma.log"; grep -E "^(FAILED|ERROR)" "$OUT/test_tma.log" | head -5 ;;
    tune)
      timeout "$(limit 300)" python3 skinny-gemm/benchmarks/tune.py --quick --dtypes "${TUNE_DTYPES:-bfloat16}" \
        --tokens "${TUNE_TOKENS:-1,2,4,8,16}" --shapes "${TUNE_SHAPES:-405B-tp8-qkv,8B-qkv}" > "$OUT/tune.log" 2>&1
      echo "tune exit $? at ${SECONDS}s"; grep -E "M=|tuned in|wrote" "$OUT/tune.log" | head -40
      cp skinny-gemm/torch-ext/skinny_gemm/_tuning.py "$OUT/_tuning.py" ;;
    sanitize)
      timeout "$(limit 120)" compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_mma.py \
        -k "(test_values and bfloat16 and (1000 or 96 or 17)) or (test_fp8_values and (1000 or 96 or 17) and tensor) or layouts or binding or fp8_bad_input or (test_staged_values and bfloat16 and (1000 or 40)) or (test_staged_fp8_values and (1000 or 96))" \
        > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $? at ${SECONDS}s"; tail -2 "$OUT/memcheck.log"
      timeout "$(limit 80)" compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_mma.py \
        -k "(test_values and 1000 and bfloat16) or (test_fp8_values and 1000 and token-channel) or (test_staged_values and 1000 and bfloat16) or (test_staged_fp8_values and 1000 and token-channel)" > "$OUT/racecheck.log" 2>&1
      echo "racecheck exit $? at ${SECONDS}s"; tail -2 "$OUT/racecheck.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
