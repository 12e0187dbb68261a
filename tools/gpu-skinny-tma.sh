#!/usr/bin/env bash
# skinny-gemm's compiled Hopper kernel (TmaConfig, csrc/skinny_tma.cu) on the device machine, in
# one call (the environment of tools/gpu-session.sh: the carried wheels in .whl/, installed
# into /tmp/site; logs to $OUT):
#   bash tools/gpu-skinny-tma.sh [tune | smoke]
# 1. builds skinny-gemm for this GPU (its CUDA variant: the binding and the kernel, sm_90);
# 2. a smoke run (60 s): the default launch at tiny and the issue's 2304 x 16384 shape against
#    fp64, and a few launches timed against cuBLAS at 1-16 tokens; a failure or hang stops
#    here, with a memcheck of the smallest case, so a broken kernel costs one short call
#    (`smoke` as the first argument stops after it: ~2 minutes with the machine's start);
# 3. the sweep of tune.py (bf16, FP8 rowwise and per tensor) at 1, 4 and 16 tokens on the Llama-405B
#    TP8 QKV shape and the 8B ones,
#    printed, not written (`tune` as the first argument writes the table instead: commit it
#    with the log); each configuration's result is checked against cuBLAS before it is timed;
# 4. the kernel's tests (values against fp64 at the issue's shapes and off-tile ones, 16-bit and
#    FP8, every compiled launch, a PDL chain, layouts, bad input, determinism, opcheck, compile,
#    CUDA graphs);
# 5. compute-sanitizer memcheck and racecheck on the kernel's value tests (TMA ring, FP8, the
#    PDL chain, the clusters' distributed shared memory);
# 6. the package's other tests and the quick benchmark with the ours_tma provider, as far as
#    the time left allows.
# Every stage's limit is cut to the time left before a 560 s deadline (the call's limit is 600);
# the logs come back as $OUT/logs.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=560
limit() { local left=$((DEADLINE - SECONDS)); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/torch-ext:$PWD/tools:$PWD/skinny-gemm/tests PYTHONUNBUFFERED=1 FUSED_LLM_ROOT=$PWD
export LOCAL_KERNELS="fused-llm/skinny-gemm=$PWD/skinny-gemm"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
timeout "$(limit 240)" python3 -m fused_llm_dev.cli build skinny-gemm 2>&1 | tail -3 | tee "$OUT/build.log"
echo "build done at ${SECONDS}s"

PYTEST=(python3 -X faulthandler -m pytest -p no:cacheprovider --import-mode=importlib -o addopts="" --noconftest)

echo "=== smoke"
cat > /tmp/smoke.py <<'PY'
import torch, torch.nn.functional as F
from test_skinny_gemm import sg, make, make_fp8, reference, reference_fp8, assert_gemm_close
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.timing import time_us
cfg = sg.TmaConfig()
for N, K in [(17, 8), (130, 64), (1000, 4104), (2304, 16384)]:
    for M in (1, 16):
        x, w, _ = make(M, N, K, torch.bfloat16, seed=M + N)
        got = sg.gemm(x, w, config=cfg)
        torch.cuda.synchronize()
        assert_gemm_close(got, reference(x, w), f"{cfg} {M}x{N}x{K}")
        print(f"ok {M}x{N}x{K}", flush=True)
N, K = 2304, 16384
m = Method(replays=10, repeats=3, budget_s=0.2)
f8 = torch.float8_e4m3fn
for M in (1, 16):
    x, w, xs, ws = make_fp8(M, N, K, f8, seed=M)
    assert_gemm_close(sg.gemm_fp8(x, w, xs, ws, config=cfg), reference_fp8(x, w, xs, ws), f"FP8 {cfg} {M}x{N}x{K}")
    print(f"ok FP8 {M}x{N}x{K}", flush=True)
for M in (1, 2, 4, 8, 16):
    def mk(fn):
        def make_call(seed):
            x, w, _ = make(M, N, K, torch.bfloat16, seed=seed)
            return lambda: fn(x, w)
        return make_call
    nbytes = 2 * (M * K + N * K + M * N)
    cub = time_us(mk(F.linear), nbytes, m).median_us
    row = [f"M={M} cublas {cub:.1f} us"]
    for c in (cfg, sg.TmaConfig(64, 2, 8), sg.TmaConfig(64, 2, 4), sg.TmaConfig(32, 4, 6)):
        t = time_us(mk(lambda x, w, c=c: sg.gemm(x, w, config=c)), nbytes, m).median_us
        row.append(f"{c.as_list()[1:]} {t:.1f} us ({cub / t:.2f}x)")
    print(" | ".join(row), flush=True)
PY
timeout "$(limit 60)" python3 -X faulthandler /tmp/smoke.py > "$OUT/smoke.log" 2>&1
rc=$?; echo "smoke exit: $rc (124: hung)" | tee -a "$OUT/smoke.log"; tail -12 "$OUT/smoke.log"
if [ $rc -ne 0 ]; then
  cat > /tmp/tiny.py <<'PY'
import torch
from test_skinny_gemm import sg, make
x, w, _ = make(1, 17, 8, torch.bfloat16)
print(sg.gemm(x, w, config=sg.TmaConfig()).float().cpu(), (x.float() @ w.float().T).cpu())
PY
  timeout "$(limit 60)" compute-sanitizer --tool memcheck python3 /tmp/tiny.py > "$OUT/tiny-memcheck.log" 2>&1
  echo "tiny memcheck exit: $?"; head -60 "$OUT/tiny-memcheck.log"
  exit 1
fi

if [ "${1:-}" = smoke ]; then (cd "$OUT" && tar czf logs.tar.gz *.log && rm -f *.log); exit 0; fi

echo "=== tune (bf16, FP8 rowwise and per tensor; 1, 4, 16 tokens) at ${SECONDS}s"
write=--no-write; [ "${1:-}" = tune ] && write=
timeout "$(limit 330)" python3 skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16,fp8,fp8-tensor --tokens 1,4,16 \
  --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down $write > "$OUT/tune-tma.log" 2>&1
echo "tune exit: $?" | tee -a "$OUT/tune-tma.log"
grep -E "M=|wrote" "$OUT/tune-tma.log" | tail -40
[ -z "$write" ] && cp skinny-gemm/torch-ext/skinny_gemm/_tuning.py "$OUT/"

echo "=== kernel tests at ${SECONDS}s"
timeout "$(limit 100)" "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_tma.py > "$OUT/test-tma.log" 2>&1
echo "pytest exit: $? (124: hit the limit)" | tee -a "$OUT/test-tma.log"
grep -E "(passed|failed|error)" "$OUT/test-tma.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/test-tma.log" | head -20

echo "=== compute-sanitizer at ${SECONDS}s"
timeout "$(limit 90)" compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_tma.py \
  -k "(fp8_values and (96 or 17) and 16) or fp8_out or pdl or (values and 1000 and bfloat16 and 9)" > "$OUT/sanitize-memcheck.log" 2>&1
echo "memcheck exit: $? (9: errors, 124: hit the limit)" | tee -a "$OUT/sanitize-memcheck.log"
tail -3 "$OUT/sanitize-memcheck.log"
T=skinny-gemm/tests/test_skinny_tma.py
timeout "$(limit 90)" compute-sanitizer --tool racecheck --error-exitcode 9 "${PYTEST[@]}" -q "$T::test_fp8_values[token-channel-16-1000-4112]" \
  "$T::test_fp8_values[tensor-5-96-208]" "$T::test_values[torch.bfloat16-16-96-200]" \
  "$T::test_fp8_out_and_bias_dtypes[torch.float32-torch.float32]" > "$OUT/sanitize-racecheck.log" 2>&1
echo "racecheck exit: $? (9: hazards, 124: hit the limit)" | tee -a "$OUT/sanitize-racecheck.log"
tail -3 "$OUT/sanitize-racecheck.log"

echo "=== package tests at ${SECONDS}s"
timeout "$(limit 90)" "${PYTEST[@]}" -q skinny-gemm/tests/test_skinny_gemm.py > "$OUT/test-skinny.log" 2>&1
echo "pytest exit: $? (124: hit the limit)" | tee -a "$OUT/test-skinny.log"
grep -E "(passed|failed|error)" "$OUT/test-skinny.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/test-skinny.log" | head -20

echo "=== benchmark (quick) at ${SECONDS}s"
timeout "$(limit 90)" python3 -m fused_llm_dev.cli bench skinny-gemm --suite skinny-gemm --quick \
  --providers ours,ours_tma,linear,cublas,read_floor --out "$OUT" > "$OUT/bench-quick.log" 2>&1
echo "bench exit: $? at ${SECONDS}s" | tee -a "$OUT/bench-quick.log"
tail -30 "$OUT/bench-quick.log"
# The device returns a few files a call: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tar.gz *.log && rm -f *.log)
