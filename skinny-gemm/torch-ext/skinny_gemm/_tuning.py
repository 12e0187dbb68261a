"""The dispatch table of ``linear`` / ``linear_fp8``: where the skinny kernel measured faster
than cuBLAS (``F.linear`` / ``torch._scaled_mm``), and with which configuration.

Written by ``benchmarks/tune.py`` on a GPU (the command that made it goes into ``MADE_BY``);
nothing else edits it. **Empty: no GPU has measured it yet**, so ``linear`` and ``linear_fp8``
run cuBLAS everywhere until it is filled.

``TABLE[(gpu_name, dtype, N, K)]`` is a list of ``(m_max, config)`` M buckets in increasing
order (M <= 1, 2, 4, 8, 16, 32, 64): a call with M tokens takes the first bucket with
``M <= m_max``; ``config`` is ``[BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages]``
for the skinny kernel, or None where cuBLAS won. ``gpu_name`` is
``torch.cuda.get_device_name()``; ``dtype`` ``"bfloat16"``, ``"float16"``,
``"float8_e4m3fn"`` or ``"float8_e4m3fnuz"`` (x's and w's).
"""

from __future__ import annotations

MADE_BY = None

TABLE: dict[tuple[str, str, int, int], list[tuple[int, list[int] | None]]] = {}
