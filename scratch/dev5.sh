set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers, kernels; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, kernels.__version__)" | tee -a "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
( time python3 -m fused_llm_dev.cli build ) 2>&1 | tail -4
export FUSED_LLM_SKIP_BUILD=1
echo "=== full suite"
timeout 330 python3 -X faulthandler -m pytest -q -n 8 -p no:cacheprovider --import-mode=importlib -o addopts="" \
  rmsnorm-fp8/tests swiglu-fp8/tests rope-triton/tests gated-mlp/tests machete-w4a16/tests skinny-gemm/tests tests > "$OUT/test.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)" "$OUT/test.log" | cut -c1-250 | head -30
tail -2 "$OUT/test.log"
echo "=== machete quick bench"
export LOCAL_KERNELS="fused-llm/machete-w4a16=$PWD/machete-w4a16"
timeout 120 python3 -m fused_llm_dev.cli bench machete-w4a16 --quick --out "$OUT" > "$OUT/bench-w4a16.log" 2>&1
echo "bench exit $?"; tail -30 "$OUT/bench-w4a16.log"
