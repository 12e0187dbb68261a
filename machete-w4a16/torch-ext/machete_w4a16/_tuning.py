"""The dispatch table of ``w4a16_gemm``: per GPU, dtype, (N, K), group size and M bucket, the
launch (kernel and tiles) that measured fastest.

Written by ``benchmarks/tune.py`` on a GPU (the command that made it goes into ``MADE_BY``);
nothing else edits it. **Empty: no GPU has measured it yet**, so every call takes the
structural default (``_kernels.w4a16_config``) until it is filled.

``TABLE[(gpu_name, dtype, N, K, group_size)]`` is a list of ``(m_max, entry)`` M buckets in
increasing order (of 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096): a call with M rows
takes the first bucket with ``M <= m_max``; past the last bucket, the default. ``entry`` is
``["splitk", BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages]`` or ``["tiled",
BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages]`` (``_config``), or None where no
candidate beat the default by the tuning margin. ``gpu_name`` is
``torch.cuda.get_device_name()``; ``dtype`` ``"bfloat16"`` or ``"float16"`` (x's and the
scales'); ``group_size`` as in QuantizedWeight (-1: per channel).
"""

from __future__ import annotations

MADE_BY = None

TABLE: dict[tuple[str, str, int, int, int], list[tuple[int, list | None]]] = {}
