"""The dispatch table of ``w4a16_gemm``: per GPU, dtype, (N, K), group size and M bucket, the
launch (kernel and tiles) that measured fastest.

Written by ``benchmarks/tune.py`` on a GPU (each run's command is added to ``MADE_BY``);
nothing else edits it but its docstring. Measured on an H100 for the eight 8B / 70B projections,
group 128, bf16: M buckets 64, 128, 256, 1024, 4096 on 2026-11-24 (the Hopper kernel among the
candidates), 1, 16 and 32 on 2026-11-25 (each point's launches timed in turns; from 17 tokens
the Hopper kernel too). Every other key takes the structural default (``_kernels.mma_config`` /
``wgmma_config`` / ``w4a16_config``).

``TABLE[(gpu_name, dtype, N, K, group_size)]`` is a list of ``(m_max, entry)`` M buckets in
increasing order (of 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096): a call with M rows
takes the first bucket with ``M <= m_max``; past the last bucket, the default. ``entry`` is
``["splitk", BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages]``, ``["tiled",
BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages]``, ``["mma", SPLIT_K, num_warps,
ROW_TILES]`` (``..., RING]`` with RING 0: the register kernel instead of the TMA ring) or
``["wgmma", BLOCK_N, BLOCK_M, SPLIT_K]`` (``_config``), or None where no
candidate beat the default by the tuning margin. ``gpu_name`` is
``torch.cuda.get_device_name()``; ``dtype`` ``"bfloat16"`` or ``"float16"`` (x's and the
scales'); ``group_size`` as in QuantizedWeight (-1: per channel).
"""

from __future__ import annotations

MADE_BY = 'python machete-w4a16/benchmarks/tune.py --quick --tokens 1,16,64,128,256,1024,4096  # NVIDIA H100 80GB HBM3, then --quick --tokens 64,128,256,1024 (the Hopper kernel with cluster splits), then python machete-w4a16/benchmarks/tune.py --tokens 1,16  # NVIDIA H100 80GB HBM3, then python machete-w4a16/benchmarks/tune.py --tokens 32  # NVIDIA H100 80GB HBM3, then python machete-w4a16/benchmarks/tune.py --tokens 1,16,32  # NVIDIA H100 80GB HBM3, then python machete-w4a16/benchmarks/tune.py --tokens 1,8,16,32  # NVIDIA H100 80GB HBM3'

TABLE: dict[tuple[str, str, int, int, int], list[tuple[int, list | None]]] = {('NVIDIA H100 80GB HBM3', 'bfloat16', 4096, 4096, 128): [(1, None),
                                                          (8, None),
                                                          (16, ['mma', 1, 8, 2, 0]),
                                                          (32, None),
                                                          (64, None),
                                                          (128, None),
                                                          (256, None),
                                                          (1024, None),
                                                          (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 4096, 14336, 128): [(1, None),
                                                           (8, None),
                                                           (16, ['mma', 2, 8, 2]),
                                                           (32, None),
                                                           (64, None),
                                                           (128, None),
                                                           (256, None),
                                                           (1024, None),
                                                           (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 6144, 4096, 128): [(1, None),
                                                          (8, None),
                                                          (16, ['mma', 1, 8, 2]),
                                                          (32, ['mma', 1, 4, 2, 0]),
                                                          (64, None),
                                                          (128, None),
                                                          (256, None),
                                                          (1024, None),
                                                          (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 8192, 8192, 128): [(1, ['mma', 1, 8, 2]),
                                                          (8, None),
                                                          (16, ['mma', 1, 8, 2]),
                                                          (32, ['mma', 1, 4, 2, 0]),
                                                          (64, None),
                                                          (128, None),
                                                          (256, None),
                                                          (1024, None),
                                                          (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 8192, 28672, 128): [(1, ['mma', 1, 8, 2]),
                                                           (8, ['mma', 2, 4, 2]),
                                                           (16, ['mma', 2, 4, 2]),
                                                           (32, ['wgmma', 128, 64, 4]),
                                                           (64, None),
                                                           (128, None),
                                                           (256, None),
                                                           (1024, None),
                                                           (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 10240, 8192, 128): [(1, None),
                                                           (8, None),
                                                           (16, ['mma', 2, 4, 2]),
                                                           (32, ['wgmma', 128, 64, 3]),
                                                           (64, ['wgmma', 128, 64, 3]),
                                                           (128, ['wgmma', 128, 128, 3]),
                                                           (256, ['wgmma', 128, 256, 1]),
                                                           (1024, None),
                                                           (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 28672, 4096, 128): [(1, ['mma', 1, 4, 2]),
                                                           (8, ['mma', 1, 4, 2]),
                                                           (16, None),
                                                           (32, ['wgmma', 128, 64, 1]),
                                                           (64, None),
                                                           (128, None),
                                                           (256, None),
                                                           (1024, None),
                                                           (4096, None)],
 ('NVIDIA H100 80GB HBM3', 'bfloat16', 57344, 8192, 128): [(1, ['mma', 2, 4, 2]),
                                                           (8, ['mma', 1, 4, 2]),
                                                           (16, None),
                                                           (32, None),
                                                           (64, None),
                                                           (128, None),
                                                           (256, None),
                                                           (1024, None),
                                                           (4096, None)]}
