set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -1
timeout 500 python3 scratch/explore.py ${STAGE:-all} 2>&1 | tee $OUT/explore.log | grep -v "^   fail" | cut -c1-200
