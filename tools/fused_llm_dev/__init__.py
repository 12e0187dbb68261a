"""fused-llm's development package: what builds, checks, benchmarks and demonstrates the
kernel packages, and the checkout's test helpers. Users import ``fused_llm`` (the Hub
integration package in torch-ext/fused_llm/), which never imports this package.

* ``cli``: the ``fused-llm`` command; ``commands``: what its subcommands do (progress output)
* ``builder``: the local stand-in for kernel-builder (``fused-llm build``)
* ``sync``: stamps common/ into the packages (``fused-llm sync``)
* ``compile_targets``: Triton kernels compiled for gfx942 / sm80 / sm90 (``fused-llm check-targets``)
* ``abi``: Hugging Face's ABI check of built variants (``fused-llm check-abi``)
* ``hub``: Hub-shaped repositories and Hugging Face caches of the builds (``fused-llm hub-repo``)
* ``bench``: the GPU benchmark harness of the packages and ``bench.e2e``, a kernelized model
  against the original (``fused-llm bench``)
* ``demo``: ``fused-llm demo``; ``models``: random-weight models for the tests and benchmarks
* ``testing``: test helpers (stamped from common/python/testing.py)
"""
