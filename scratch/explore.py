"""Exploration on the GPU: read floor and skinny configs at one shape. Not committed."""
import itertools, sys, time, json, os
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from fused_llm.packages import get_kernel
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.timing import time_us

METHOD = Method(replays=10, repeats=3, budget_s=0.2)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
sk = get_kernel("skinny-gemm")
res = []

def log(*a):
    print(*a, flush=True)

@triton.jit
def _floor_plain(w_ptr, out_ptr, N, K, K_SPLIT, BN: tl.constexpr, BK: tl.constexpr):
    pid_n = tl.program_id(0); pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, BK), tl.float32)
    p = w_ptr + rows.to(tl.int64)[:, None] * K + tl.arange(0, BK)[None, :]
    for k0 in range(pid_k * K_SPLIT, pid_k * K_SPLIT + K_SPLIT, BK):
        acc += tl.load(p + k0).to(tl.float32)
    tl.store(out_ptr + pid_k * N + rows, tl.sum(acc, 1))

@triton.jit
def _floor_tma(w_desc, out_ptr, N, K, K_SPLIT, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0); pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in tl.range(pid_k * K_SPLIT, pid_k * K_SPLIT + K_SPLIT, BK, num_stages=STAGES):
        acc += w_desc.load([pid_n * BN, k0]).to(tl.float32)
    tl.store(out_ptr + pid_k * N + rows, tl.sum(acc, 1))

@triton.jit
def _skinny_tma(w_desc, x_ptr, out_ptr, part_ptr, count_ptr, M, N, K, K_SPLIT, s_xm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0); pid_k = tl.program_id(1); pid_m = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + (rows % M).to(tl.int64)[:, None] * s_xm
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    if BLOCK_M > 1:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        w = w_desc.load([pid_n * BLOCK_N, k0])
        x = tl.load(x_rows + (k0 + ks)[None, :])
        if BLOCK_M > 1:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc2 += w.to(tl.float32) * x.to(tl.float32)
    if BLOCK_M > 1:
        res = tl.trans(acc)
    else:
        res = tl.reshape(tl.sum(acc2, axis=1), (1, BLOCK_N))
    tile = pid_m * tl.num_programs(0) + pid_n
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    plane = BLOCK_M * BLOCK_N
    counter = count_ptr + tile
    tile_part = part_ptr + tile.to(tl.int64) * (SPLIT_K * plane) + local
    tl.store(tile_part + pid_k * plane, res)
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        res = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(SPLIT_K):
            res += tl.load(tile_part + s * plane, cache_modifier=".cg")
        tl.atomic_xchg(counter, 0)
        o = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(o, res.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])

COUNT = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")

def tma_gemm(x, w, out, bm, bn, bk, split, warps, stages):
    M, K = x.shape; N = w.shape[0]
    k_split = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_split)
    desc = TensorDescriptor.from_tensor(w, [bn, bk])
    tiles = triton.cdiv(N, bn) * triton.cdiv(M, bm)
    part = torch.empty(tiles * split * bm * bn, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, bn), split, triton.cdiv(M, bm))
    def run():
        _skinny_tma[grid](desc, x, out, part, COUNT, M, N, K, k_split, x.stride(0), BLOCK_M=bm, BLOCK_N=bn,
                          BLOCK_K=bk, SPLIT_K=split, STAGES=stages, num_warps=warps)
        return out
    return run

def floor_fn(kind, N, K, bn, bk, split, warps, stages, elem):
    dt = torch.bfloat16 if elem == 2 else torch.float8_e4m3fn
    def make(seed):
        w = torch.randn(N, K, device="cuda").to(dt)
        k_split = K // split
        out = torch.empty(split * N, device="cuda")
        grid = (N // bn, split)
        if kind == "plain":
            return lambda: _floor_plain[grid](w, out, N, K, k_split, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
        desc = TensorDescriptor.from_tensor(w, [bn, bk])
        return lambda: _floor_tma[grid](desc, out, N, K, k_split, BN=bn, BK=bk, STAGES=stages, num_warps=warps)
    return make

def t(make, nbytes):
    try:
        return time_us(make, nbytes, METHOD).median_us
    except Exception as e:
        log("   fail", type(e).__name__, str(e)[:150]); return float("nan")

N, K = 2304, 16384
stage = sys.argv[1] if len(sys.argv) > 1 else "all"
if stage in ("floor", "all"):
    nb = 2 * N * K
    log(f"read floor of {nb/1e6:.1f} MB; torch.amax:", t(lambda s: (lambda w: (lambda: torch.amax(w)))(torch.randn(N, K, device='cuda').bfloat16()), nb))
    for kind, bn, bk, split, warps, stages in [
        ("plain", 64, 256, 8, 4, 1), ("plain", 64, 256, 16, 4, 1), ("plain", 128, 128, 16, 8, 1), ("plain", 32, 256, 8, 4, 1),
        ("tma", 64, 128, 8, 4, 4), ("tma", 64, 128, 16, 4, 4), ("tma", 128, 128, 8, 4, 4), ("tma", 128, 128, 14, 8, 3),
        ("tma", 64, 256, 8, 4, 3), ("tma", 64, 128, 11, 4, 6), ("tma", 32, 256, 16, 4, 4)]:
        us = t(floor_fn(kind, N, K, bn, bk, split, warps, stages, 2), nb)
        log(f"floor {kind} bn{bn} bk{bk} split{split} w{warps} s{stages}: {us:.2f} us {nb/us/1e6:.2f} TB/s")

def skinny_row(M, dtype, fp8=False):
    x = torch.randn(M, K, device="cuda").to(dtype)
    nbytes = 2 * N * K
    def cub(seed):
        w = torch.randn(N, K, device="cuda").bfloat16(); xx = x.clone()
        return lambda: torch.nn.functional.linear(xx, w)
    tc = t(cub, nbytes)
    log(f"M={M} cuBLAS {tc:.2f} us ({nbytes/tc/1e6:.2f} TB/s)")
    cands = []
    for bn, bk, warps, stages in [(64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3), (128, 128, 4, 4), (64, 128, 4, 6), (32, 256, 4, 4), (128, 64, 4, 6), (256, 64, 8, 4)]:
        tiles = N // bn
        steps = K // bk
        splits = sorted({s for w in (1, 2, 4) for s in [max(1, (w * SMS) // tiles)] if s <= steps})
        for s in splits:
            cands.append((bn, bk, warps, stages, s))
    bms = [1, 16] if M == 1 else [16]
    for bm in bms:
        for bn, bk, warps, stages, s in cands:
            for kind in ("pkg", "tma"):
                def make(seed, kind=kind, bn=bn, bk=bk, warps=warps, stages=stages, s=s):
                    w = torch.randn(N, K, device="cuda").bfloat16(); xx = x.clone()
                    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    if kind == "pkg":
                        cfg = sk.SkinnyConfig(bm, bn, bk, s, warps, stages)
                        return lambda: sk.gemm(xx, w, out=out, config=cfg)
                    fn = tma_gemm(xx, w, out, bm, bn, bk, s, warps, stages)
                    if seed == 0:
                        ref = torch.nn.functional.linear(xx, w).float(); got = fn().float()
                        err = (got - ref).abs().max().item()
                        if err > 2e-2 * ref.abs().max().item():
                            log("   TMA WRONG", err)
                    return fn
                us = t(make, nbytes)
                res.append(dict(M=M, kind=kind, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=s, us=us, cublas=tc))
                log(f"  {kind} bm{bm} bn{bn} bk{bk} w{warps} s{stages} split{s}: {us:.2f} us  {tc/us:.3f}x cuBLAS  {nbytes/us/1e6:.2f} TB/s")

if stage in ("m16", "all"):
    skinny_row(16, torch.bfloat16)
if stage in ("m1", "all"):
    x = torch.randn(1, K, device="cuda").bfloat16()
    nbytes = 2 * N * K
    def cub(seed):
        w = torch.randn(N, K, device="cuda").bfloat16(); xx = x.clone()
        return lambda: torch.nn.functional.linear(xx, w)
    tc = t(cub, nbytes); log(f"M=1 cuBLAS {tc:.2f}")
    for bm, bn, bk, warps, stages, s in [(1, 64, 128, 4, 1, 3), (1, 64, 256, 4, 1, 3), (1, 128, 128, 8, 1, 7), (1, 64, 128, 4, 1, 7),
                                         (1, 32, 256, 4, 1, 4), (1, 128, 128, 4, 1, 3), (1, 64, 512, 8, 1, 3), (1, 32, 512, 4, 1, 2),
                                         (16, 64, 128, 4, 6, 3), (16, 64, 256, 4, 3, 3), (16, 64, 128, 4, 4, 3), (16, 32, 256, 4, 4, 3),
                                         (16, 64, 128, 4, 8, 2), (16, 64, 256, 4, 4, 2), (16, 128, 128, 4, 4, 3)]:
        def make(seed, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, s=s):
            w = torch.randn(N, K, device="cuda").bfloat16(); xx = x.clone()
            out = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
            cfg = sk.SkinnyConfig(bm, bn, bk, s, warps, stages)
            return lambda: sk.gemm(xx, w, out=out, config=cfg)
        us = t(make, nbytes)
        log(f"  pkg bm{bm} bn{bn} bk{bk} w{warps} s{stages} split{s}: {us:.2f} us  {tc/us:.3f}x cuBLAS  {nbytes/us/1e6:.2f} TB/s")
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"explore_{stage}.json"), "w"))
