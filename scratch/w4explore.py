import torch, os, json, sys, itertools
from fused_llm.packages import get_kernel
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.timing import time_us
METHOD = Method(replays=10, repeats=3, budget_s=0.2)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
w4 = get_kernel("machete-w4a16"); kern = w4._triton_kernels()
res = []
def t(make, nb):
    try: return time_us(make, nb, METHOD).median_us
    except Exception as e: print("  fail", type(e).__name__, str(e)[:160], flush=True); return float("nan")
def sweep(N, K, M, cfgs):
    nb16 = 2 * N * K; nb4 = N * K // 2 + 2 * N * K // 128
    W = (torch.randn(N, K, device="cuda") / K**0.5).bfloat16(); qw = w4.quantize(W, 128)
    def cub(seed):
        x = torch.randn(M, K, device="cuda").bfloat16(); w = W.clone()
        return lambda: torch.nn.functional.linear(x, w)
    tc = t(cub, nb16)
    x0 = torch.randn(M, K, device="cuda").bfloat16(); exp = torch.nn.functional.linear(x0, w4.dequantize(qw)).float()
    print(f"{N}x{K} M={M}: cuBLAS {tc:.2f} us; int4 floor@2.8TB/s {nb4/2.8e6:.2f} us; default cfg {kern.w4a16_config(M, N, K, 128, SMS)}", flush=True)
    for c in [None] + cfgs:
        def make(seed, c=c):
            q = w4.QuantizedWeight(qw.qweight.clone(), qw.scales.clone(), None, None, 128)
            x = torch.randn(M, K, device="cuda").bfloat16(); out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            if c is None:
                return lambda: w4.w4a16_gemm(x, q)
            return lambda: kern.launch_w4a16(x, q.qweight, q.scales, None, None, None, out, 128, cfg=dict(c))
        if c is not None:
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            try:
                kern.launch_w4a16(x0, qw.qweight, qw.scales, None, None, None, out, 128, cfg=dict(c))
            except Exception as e:
                print("  fail", c, type(e).__name__, str(e)[:150], flush=True); continue
            err = (out.float() - exp).abs().max().item() / exp.abs().max().item()
        else:
            err = (w4.w4a16_gemm(x0, qw).float() - exp).abs().max().item() / exp.abs().max().item()
        us = t(make, nb4)
        res.append(dict(N=N, K=K, M=M, cfg=c, us=us, cublas=tc, err=err))
        print(f"  {c}: {us:.2f} us  {tc/us:.2f}x cuBLAS  {nb4/us/1e6:.2f} TB/s  err {err:.1e}", flush=True)
def cfgs_for(N, K, M):
    out = []
    bm = 1 if M == 1 else 16
    for bn, bk, warps, stages in [(64, 128, 4, 3), (64, 256, 4, 3), (32, 512, 4, 3), (128, 256, 8, 3), (64, 512, 4, 2), (16, 512, 4, 3), (32, 256, 4, 4), (128, 128, 4, 4)]:
        tiles = -(-N // bn)
        for p in (1, 2, 4):
            split = max(1, min(K // bk, round(p * SMS / tiles)))
            c = {"kernel": "splitk", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "USE_DOT": bm > 1, "num_warps": warps, "num_stages": stages}
            if c not in out: out.append(c)
    if M == 1:
        out += [dict(c, BLOCK_M=16, USE_DOT=True) for c in out[:12]]
    return out
for (N, K) in [(6144, 4096), (4096, 14336)]:
    for M in (1, 16):
        sweep(N, K, M, cfgs_for(N, K, M))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "w4explore.json"), "w"))
