"""The dispatch table of ``linear`` / ``linear_fp8``: where the skinny kernel measured faster
than cuBLAS (``F.linear`` / ``torch._scaled_mm``), and with which configuration.

Written by ``benchmarks/tune.py`` on a GPU (the command that made it goes into ``MADE_BY``);
nothing else edits it but its docstring. Measured on an H100 (2026-11-24) for the Llama-405B
TP8 QKV / down and Llama-3-8B QKV / O / down shapes at M buckets 1, 4, 16, 64, then (the GEMV
among the candidates) for all eleven shapes of the issue at M = 1 (bf16 last, with 1-3
stages among them); the five shapes' buckets 1, 4, 16 again on 2026-11-28 with the compiled
Hopper kernel (bf16, FP8 rowwise and per tensor). On an H200 (2026-11-28): bf16 at 405B-TP8
QKV and 8B QKV / O / down, FP8 at 405B-TP8 QKV, buckets 1, 4, 16. Every other GPU, shape and
dtype runs cuBLAS, and so does an M past a shape's last bucket.

``TABLE[(gpu_name, dtype, N, K)]`` is a list of ``(m_max, config)`` M buckets in increasing
order (M <= 1, 2, 4, 8, 16, 32, 64): a call with M tokens takes the first bucket with
``M <= m_max``; ``config`` is ``[BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages]``
for the Triton kernel, ``[0, tile_n, boxes_k, stages, split]`` for the compiled Hopper kernel,
``[-1, row_groups, unroll, warps]`` for the compiled tensor-core GEMV (on the H200 since
2026-11-29: 8B QKV at 2-8 tokens), or None where cuBLAS won. ``gpu_name`` is
``torch.cuda.get_device_name()``; ``dtype`` ``"bfloat16"``, ``"float16"``,
``"float8_e4m3fn"`` or ``"float8_e4m3fnuz"`` (x's and w's).
"""

from __future__ import annotations

MADE_BY = "python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8 --shapes 405B-tp8-qkv,405B-tp8-down,8B-qkv,8B-o,8B-down --tokens 1,4,16,64; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --shapes 405B-tp8-qkv,405B-tp8-down,8B-qkv,8B-o,8B-down --tokens 1,4,16,64  # NVIDIA H100 80GB HBM3; python skinny-gemm/benchmarks/tune.py --quick --tokens 1  # NVIDIA H100 80GB HBM3; python skinny-gemm/benchmarks/tune.py --quick --tokens 1  # NVIDIA H100 80GB HBM3; python skinny-gemm/benchmarks/tune.py --quick --tokens 1 --dtypes bfloat16  # NVIDIA H100 80GB HBM3; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16,fp8,fp8-tensor --tokens 1,4,16 --shapes 405B-tp8-qkv,405B-tp8-down,8B-qkv,8B-o,8B-down  # NVIDIA H100 80GB HBM3, 2026-11-28 (this header line added by hand: the run stopped at its 330 s limit after 41 of 45 points, before writing the table) (41 points, written from its log); python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8-tensor --tokens 1,4,16 --shapes 8B-o,8B-down  # NVIDIA H100 80GB HBM3; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 1,4,16 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200, 2026-11-28, each call after another kernel (the default since then); 12 points, written from its log with --from-log (the next run's merge had dropped them); python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8,fp8-tensor --tokens 1,4,16 --shapes 405B-tp8-qkv  # NVIDIA H200, 2026-11-28, each call after another kernel; by hand, 2026-11-28: the H100's bfloat16 and float8_e4m3fn/tensor entries of the compiled kernel (tag 0) set to None (cuBLAS): they were timed back to back, where the kernel's start overlaps its previous call; in a layer on the H200 the same kernel read 0.89-1.04x cuBLAS (skinny-gemm/benchmarks/results/INDEX.md); an H100 run of this script (in a layer, its default now) re-measures them; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 2,4,8 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8-tensor --tokens 2,4,8 --shapes 405B-tp8-qkv  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --tokens 1,2 --dtypes bfloat16 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 2,4,8 --shapes 405B-tp8-qkv,8B-qkv  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 2,4,8 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200 (12 points, written from its log); python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8-tensor --tokens 1,2,4,8,16 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200 (18 points, written from its log); python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 2,4,8 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --dtypes fp8-tensor --tokens 1,2,4,8 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200 (15 points, written from its log); python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 1 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 1 --shapes 8B-lm_head  # NVIDIA H200 (1 point, its row copied from the log: cuBLAS 243.2 us, best skinny 230.8); python skinny-gemm/benchmarks/tune.py --quick --dtypes bfloat16 --tokens 2,4,8 --shapes 405B-tp8-qkv  # NVIDIA H200 (its 8-token launch rewritten by hand from the probe build's form [-1, 1, 4, 4, 13, 4] to [-1, 1, 4, 4, 3, 4, 1]: the same kernel, shared_x); python skinny-gemm/benchmarks/tune.py --rows-only --quick --dtypes bfloat16 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down --tokens 1,2,4,8  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --rows-only --quick --dtypes bfloat16 --shapes 8B-lm_head --tokens 1  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --rows-only --quick --dtypes fp8-tensor --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down --tokens 1,2,4,8,16  # NVIDIA H200; python skinny-gemm/benchmarks/tune.py --rows-only --quick --dtypes bfloat16 --shapes 405B-tp8-qkv,8B-qkv,8B-o,8B-down --tokens 8,16  # NVIDIA H200"

TABLE: dict[tuple[str, str, int, int], list[tuple[int, list[int] | None]]] = {('NVIDIA H100 80GB HBM3', 'bfloat16', 2304, 16384): [(1, [1, 4, 4096, 1, 8, 3]),
                                                      (4, None),
                                                      (16, None),
                                                      (64, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 4096, 4096): [(1, None), (4, None), (16, None), (64, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 4096, 14336): [(1, [1, 4, 2048, 1, 8, 2]),
                                                      (4, None),
                                                      (16, None),
                                                      (64, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 6144, 4096): [(1, [1, 4, 4096, 1, 8, 1]),
                                                     (4, None),
                                                     (16, None),
                                                     (64, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 8192, 8192): [(1, [1, 4, 4096, 1, 8, 1])],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 8192, 28672): [(1, [1, 4, 4096, 1, 8, 1])],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 10240, 8192): [(1, [1, 4, 4096, 1, 8, 3])],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 13312, 16384): [(1, [1, 4, 4096, 1, 8, 2])],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 16384, 6656): [(1, [1, 4, 4096, 1, 8, 3]),
                                                      (4, [16, 64, 128, 1, 4, 4]),
                                                      (16, [16, 64, 128, 1, 4, 4]),
                                                      (64, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 28672, 4096): [(1, [1, 4, 4096, 1, 8, 2])],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 57344, 8192): [(1, [1, 4, 4096, 1, 8, 2])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 2304, 16384): [(1, [0, 64, 2, 8, 3]),
                                                           (4, [0, 64, 2, 8, 3]),
                                                           (16, [0, 64, 2, 8, 3]),
                                                           (64, [64, 32, 256, 8, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 4096, 4096): [(1, [0, 64, 4, 3, 2]),
                                                          (4, [0, 64, 4, 3, 2]),
                                                          (16, [0, 64, 4, 3, 2]),
                                                          (64, [64, 32, 256, 2, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 4096, 14336): [(1, [0, 64, 2, 8, 2]),
                                                           (4, [0, 64, 2, 8, 2]),
                                                           (16, [0, 64, 2, 8, 2]),
                                                           (64, [64, 32, 256, 3, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 6144, 4096): [(1, [0, 64, 2, 8, 1]),
                                                          (4, [0, 64, 2, 8, 1]),
                                                          (16, [0, 64, 2, 8, 1]),
                                                          (64, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 8192, 8192): [(1, [16, 64, 256, 2, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 8192, 28672): [(1, [1, 32, 256, 2, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 10240, 8192): [(1, [1, 4, 4096, 1, 8, 3])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 13312, 16384): [(1, [16, 64, 256, 2, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 16384, 6656): [(1, [0, 128, 2, 4, 1]),
                                                           (4, [0, 128, 2, 4, 1]),
                                                           (16, [16, 64, 256, 1, 4, 4]),
                                                           (64, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 28672, 4096): [(1, [1, 32, 256, 1, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn', 57344, 8192): [(1, [16, 64, 256, 1, 4, 4])],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn/tensor', 2304, 16384): [(1, None), (4, None), (16, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn/tensor', 4096, 4096): [(1, None), (4, None), (16, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn/tensor', 4096, 14336): [(1, None), (4, None), (16, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn/tensor', 6144, 4096): [(1, None), (4, None), (16, None)],
 ('NVIDIA H100 80GB HBM3', 'float8_e4m3fn/tensor', 16384, 6656): [(1, None), (4, None), (16, None)],
 ('NVIDIA H200', 'bfloat16', 2304, 16384): [(1, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                            (2, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                            (4, [-1, 1, 2, 8, 0, 1, 0, 4]),
                                            (8, [-1, 1, 2, 8, 0, 1, 0, 2]),
                                            (16, [16, 64, 128, 4, 4, 4])],
 ('NVIDIA H200', 'bfloat16', 4096, 4096): [(1, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                           (2, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                           (4, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                           (8, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                           (16, [-1, 2, 2, 8, 0, 1, 0, 2])],
 ('NVIDIA H200', 'bfloat16', 4096, 14336): [(1, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                            (2, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                            (4, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                            (8, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                            (16, None)],
 ('NVIDIA H200', 'bfloat16', 6144, 4096): [(1, [-1, 2, 2, 8, 0, 1, 0, 4]),
                                           (2, [-1, 2, 2, 8, 0, 1, 0, 4]),
                                           (4, [-1, 2, 2, 8, 0, 1, 0, 4]),
                                           (8, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                           (16, None)],
 ('NVIDIA H200', 'bfloat16', 128256, 4096): [(1, [-1, 2, 2, 8, 0, 1, 0, 4])],
 ('NVIDIA H200', 'float8_e4m3fn', 2304, 16384): [(1, [1, 4, 4096, 1, 8, 2]),
                                                 (4, [16, 64, 256, 4, 4, 4]),
                                                 (16, [16, 64, 256, 4, 4, 4])],
 ('NVIDIA H200', 'float8_e4m3fn/tensor', 2304, 16384): [(1, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                                        (2, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                                        (4, [-1, 1, 2, 4, 0, 1, 0, 4]),
                                                        (8, [-1, 1, 2, 8, 0, 1, 0, 2]),
                                                        (16, [-1, 1, 2, 8])],
 ('NVIDIA H200', 'float8_e4m3fn/tensor', 4096, 4096): [(1, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                       (2, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                       (4, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                       (8, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                       (16, [-1, 2, 2, 8])],
 ('NVIDIA H200', 'float8_e4m3fn/tensor', 4096, 14336): [(1, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                        (2, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                                        (4, [-1, 2, 2, 4, 0, 1, 0, 4]),
                                                        (8, [-1, 2, 2, 8, 0, 1, 0, 2]),
                                                        (16, None)],
 ('NVIDIA H200', 'float8_e4m3fn/tensor', 6144, 4096): [(1, [-1, 4, 2, 4, 0, 1, 0, 8]),
                                                       (2, [-1, 4, 1, 4, 0, 1, 0, 4]),
                                                       (4, [-1, 1, 4, 2, 3, 1]),
                                                       (8, [-1, 1, 4, 2, 3, 1]),
                                                       (16, None)]}
