#!/usr/bin/env bash
# One GPU-machine session for the device tool: install the carried wheels, build the CUDA
# variants, then run the requested stages. Logs go to $OUT (the device tool brings them back).
#   bash tools/gpu-session.sh test sanitize demo bench-quick bench sm80 abi-check
# abi-check needs Hugging Face's checker among the carried wheels:
#   kernel_abi_check-0.14.1-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
( time python3 -m fused_llm_dev.cli build ) 2>&1 | tee /tmp/build.log | tail -3 || exit 1
for stage in "$@"; do
  echo "=== stage $stage"
  case $stage in
    test)
      python3 -X faulthandler -m pytest -v -x -p no:cacheprovider --import-mode=importlib -o addopts="" ${TESTS:-rmsnorm-fp8/tests swiglu-fp8/tests rope-triton/tests gated-mlp/tests machete-w4a16/tests skinny-gemm/tests tests} > "$OUT/test.log" 2>&1
      echo "pytest exit: $?"
      grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/test.log" | tail -3
      grep -E "Fatal Python|File .*(tests|torch-ext|rmsnorm)" "$OUT/test.log" | head -20
      tail -5 "$OUT/test.log" ;;
    sanitize)  # kernels only: the bad-input tests launch none
      for tool in memcheck racecheck; do
        FUSED_LLM_SKIP_BUILD=1 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
          ${SANITIZE_TESTS:-rmsnorm-fp8/tests swiglu-fp8/tests rope-triton/tests gated-mlp/tests machete-w4a16/tests skinny-gemm/tests} -k "${SANITIZE_K:-(ci or non_contiguous or misaligned or leading or in_place or generic) and not raw_op and not bad_input}" 2>&1 | tee "$OUT/sanitize-$tool.log" | tail -6
        echo "compute-sanitizer $tool exit: ${PIPESTATUS[0]}"
      done ;;
    demo) python3 -m fused_llm_dev.cli demo --no-build 2>&1 | tee "$OUT/demo.log" ;;
    bench-quick) python3 -m fused_llm_dev.cli bench ${BENCH_PKG:-rmsnorm-fp8} --quick --out "$OUT" 2>&1 | tee "$OUT/bench-quick.log" | tail -30 ;;
    bench) python3 -m fused_llm_dev.cli bench ${BENCH_PKG:-rmsnorm-fp8} --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -70 ;;
    sm80)  # the sm80 code path through PTX: builds with only capability 8.0 (sm_80 + PTX), then the normal build back
      for pkg in ${SM80_PKGS:-rmsnorm-fp8 swiglu-fp8}; do
        python3 -m fused_llm_dev.cli build $pkg --capabilities 8.0 2>&1 | tail -1
        FUSED_LLM_SKIP_BUILD=1 python3 -m pytest -q -x -p no:cacheprovider -o addopts="" --import-mode=importlib $pkg/tests 2>&1 | tee "/tmp/test-sm80-$pkg.log" | tail -2
        python3 -m fused_llm_dev.cli build $pkg 2>&1 | tail -1
      done ;;
    abi-check)  # Hugging Face's ABI check (manylinux_2_28, abi3) on the variants just built: the CUDA ones
      python3 -m fused_llm_dev.cli check-abi 2>&1 | tee "$OUT/abi-check.log"
      echo "check-abi exit: ${PIPESTATUS[0]}" | tee -a "$OUT/abi-check.log"
      # The evidence behind it: symbol versions and needed libraries of every .so.
      if command -v objdump >/dev/null; then
        for so in */build/*/*.so; do
          echo "== $so"
          objdump -T "$so" | grep -oE "\((GLIBC|GLIBCXX|CXXABI)_[0-9.]+\)" | sort -V | uniq -c
          objdump -p "$so" | grep NEEDED
        done >> "$OUT/abi-check.log" 2>&1
      fi
      ( gcc --version | head -1; ldd --version | head -1 ) >> "$OUT/abi-check.log" 2>&1 ;;
  esac
done
