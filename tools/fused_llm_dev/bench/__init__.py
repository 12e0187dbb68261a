"""The one GPU benchmark harness for every fused-llm package.

A package describes *what* to measure in ``<pkg>/benchmarks/suite.py`` (a ``build_suite() ->
Suite``: cases, providers, bytes moved per call); this module decides *how* to measure, so
every package is timed the same way as the peers in ``shared/reference/baseline-h200.md``:

* each provider runs on enough independent input sets that the working set exceeds 4x the L2
  (one call alone often fits in the 50-60 MB L2, and re-reading a cached buffer measures the
  cache, not HBM), and on at least 16 where they fit in 2 GiB (the graph's start falls on its
  first call: spread over three 75 MB GEMMs it added 0.7 us to cuBLAS's calls, 1.4 us to a
  kernel that overlaps its predecessor);
* all calls are captured into ONE CUDA graph after a warm-up (torch.compile compilation, Triton
  autotuning and handle creation happen there, never in the numbers), and the graph is
  replayed: this removes the host launch gaps that otherwise dominate decode-size calls;
* each replay is timed with CUDA events; we report the median and p20/p80 per call;
* bandwidth is compared with a copy ceiling measured in the same process
  (``torch.mul(a, 1.0, out=b)`` on 2 GiB bf16, read + write bytes), not the datasheet.

Entry point: ``fused-llm bench <pkg> [--quick] [--out DIR] [--providers a,b]`` (or ``python -m
fused_llm_dev.bench <pkg> ...``), which calls ``run.main(pkg, argv)``. Results go to
``<pkg>/benchmarks/results/<suite>_<GPU>.{json,csv,png}``.

Modules, in the order a run uses them:

* ``suite``: what a package declares (``Case``, ``Provider``, ``Suite``) and helpers for
  writing a suite (peers from other libraries, the torch.compile peer, output checks);
* ``settings``: how each point is timed (``Method``) and the command-line options (no torch
  import, so ``fused-llm bench --help`` answers at once);
* ``timing``: CUDA-graph timing of a list of calls, the copy ceiling, the launch floor;
* ``run``: verifying providers, timing every case, the ``fused-llm bench PKG`` entry point;
* ``report``: the results (``Result``, ``Run``), their metadata, JSON / CSV / PNG and table;
* ``e2e``: ``fused-llm bench e2e``, a kernelized transformers model against the original.
"""

from __future__ import annotations
