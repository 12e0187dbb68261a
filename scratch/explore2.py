import torch, os, json, sys
from fused_llm.packages import get_kernel
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.timing import time_us
sys.path.insert(0, "skinny-gemm/benchmarks"); import benchmark as ref
METHOD = Method(replays=10, repeats=3, budget_s=0.2)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
sk = get_kernel("skinny-gemm")
res = []
def t(make, nb):
    try: return time_us(make, nb, METHOD).median_us
    except Exception as e: print("  fail", type(e).__name__, str(e)[:120], flush=True); return float("nan")
def sweep(N, K, M, fp8, cfgs):
    el = 1 if fp8 else 2
    nb = el * N * K
    if fp8:
        def cub(seed):
            xq, wq, xs, ws = ref.make_fp8(M, N, K, "cuda", seed); wsT = ws.reshape(1, -1).contiguous()
            return lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=wsT, out_dtype=torch.bfloat16)
    else:
        def cub(seed):
            x, w = ref.make_x(M, K, "cuda", seed), ref.make_weight(N, K, "cuda", seed)
            return lambda: torch.nn.functional.linear(x, w)
    tc = t(cub, nb); exp = cub(0)().float()
    print(f"{'fp8' if fp8 else 'bf16'} {N}x{K} M={M}: cuBLAS {tc:.2f} us ({nb/tc/1e6:.2f} TB/s)", flush=True)
    for bm, bn, bk, warps, stages in cfgs:
        tiles = -(-N // bn) * -(-M // bm)
        splits = sorted({max(1, min(K // bk, round(k * SMS / tiles))) for k in (0.8, 1, 2, 4)})
        for s in splits:
            cfg = sk.SkinnyConfig(bm, bn, bk, s, warps, stages)
            def make(seed, cfg=cfg):
                if fp8:
                    xq, wq, xs, ws = ref.make_fp8(M, N, K, "cuda", seed)
                    return lambda: sk.gemm_fp8(xq, wq, xs, ws, config=cfg)
                x, w = ref.make_x(M, K, "cuda", seed), ref.make_weight(N, K, "cuda", seed)
                out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                return lambda: sk.gemm(x, w, out=out, config=cfg)
            try:
                got = make(0)().float(); err = (got - exp).abs().max().item() / exp.abs().max().item()
            except Exception as e:
                print("  fail", cfg.as_list(), type(e).__name__, str(e)[:100], flush=True); continue
            us = t(make, nb)
            res.append(dict(N=N, K=K, M=M, fp8=fp8, cfg=cfg.as_list(), us=us, cublas=tc, err=err))
            print(f"  {cfg.as_list()}: {us:.2f} us {tc/us:.3f}x  {nb/us/1e6:.2f} TB/s  err {err:.1e}", flush=True)
GEMV = [(1, 16, 1024, 4, 3), (1, 32, 512, 4, 3), (1, 64, 256, 4, 4), (1, 8, 2048, 4, 3), (1, 32, 1024, 8, 3), (1, 16, 512, 4, 4)]
DOT = [(16, 16, 512, 4, 4), (16, 32, 512, 4, 4), (16, 32, 256, 4, 6), (16, 64, 256, 4, 4), (16, 64, 128, 4, 6), (16, 16, 1024, 4, 3)]
which = sys.argv[1]
if which == "bf16":
    sweep(2304, 16384, 1, False, GEMV + DOT)
    sweep(2304, 16384, 16, False, DOT)
elif which == "fp8":
    sweep(2304, 16384, 16, True, [(16, 64, 256, 4, 3), (16, 32, 512, 4, 4), (16, 64, 256, 4, 4), (16, 16, 1024, 4, 3)])
    sweep(2304, 16384, 1, True, [(1, 64, 256, 4, 3), (1, 32, 512, 4, 3), (1, 16, 1024, 4, 3), (16, 64, 256, 4, 3)])
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"explore2_{which}.json"), "w"))
