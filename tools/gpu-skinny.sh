#!/usr/bin/env bash
# skinny-gemm's first GPU run, in one call on the device machine (the environment of
# tools/gpu-session.sh: the carried wheels in .whl/, installed into /tmp/site; logs to $OUT):
#   bash tools/gpu-skinny.sh
# 1. builds skinny-gemm alone (noarch: a copy, no compile) and runs its tests on CUDA
#    (--noconftest: the root conftest would build every package, minutes of nvcc): values at
#    the shapes, FP8, every tile / split configuration, CUDA graphs, a side stream,
#    determinism of the ordered reduction;
# 2. compute-sanitizer memcheck on the kernel tests of every reduction / tile path and
#    racecheck on the CI case and the configuration sweep (the partials, the atomic workspace,
#    the arrival counters);
# 3. the quick benchmark (`fused-llm bench skinny-gemm --quick`: Llama-405B TP8 QKV, 8B QKV,
#    70B down at 1 / 16 / 64 tokens, bf16 and FP8, against cuBLAS and the read floor). The
#    torch.compile max-autotune peer autotunes every shape (minutes): it runs in the full
#    benchmark, `fused-llm bench skinny-gemm`, a separate call.
# Each stage has a time limit, so the whole stays under 8 minutes on an H100; a stage that hits
# its limit says so in its log and the next one still runs. The tuning table is not written
# here: `python skinny-gemm/benchmarks/tune.py --quick` (a separate call, ~minutes per dtype).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
# --noconftest below: the package conftest that puts tests/ on sys.path for its helpers does not run
export PYTHONPATH=$PYTHONPATH:$PWD/skinny-gemm/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -1

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)

echo "=== tests"
timeout 180 "${PYTEST[@]}" -v skinny-gemm/tests > "$OUT/test-skinny.log" 2>&1
echo "pytest exit: $? (124: hit the 180 s limit)" | tee -a "$OUT/test-skinny.log"
grep -E "(passed|failed|error)" "$OUT/test-skinny.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/test-skinny.log" | head -20

echo "=== compute-sanitizer"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_gemm.py \
  -k "gemm_ci or test_configs or edges or strides_and_out or bias_out_dtypes or cuda_graph" > "$OUT/sanitize-memcheck.log" 2>&1
echo "compute-sanitizer memcheck exit: $? (9: errors found, 124: hit the 120 s limit)" | tee -a "$OUT/sanitize-memcheck.log"
tail -4 "$OUT/sanitize-memcheck.log"
timeout 75 compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_gemm.py \
  -k "gemm_ci or test_configs" > "$OUT/sanitize-racecheck.log" 2>&1
echo "compute-sanitizer racecheck exit: $? (9: hazards found, 124: hit the 75 s limit)" | tee -a "$OUT/sanitize-racecheck.log"
tail -3 "$OUT/sanitize-racecheck.log"

echo "=== benchmark (quick)"
timeout 150 python3 -m fused_llm_dev.cli bench skinny-gemm --quick --providers ours,ours_atomic,linear,cublas,read_floor \
  --out "$OUT" > "$OUT/bench-quick.log" 2>&1
echo "bench exit: $? (124: hit the 150 s limit)" | tee -a "$OUT/bench-quick.log"
tail -50 "$OUT/bench-quick.log"
