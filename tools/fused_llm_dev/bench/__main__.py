"""``python -m fused_llm_dev.bench PKG [options]``: the same as ``fused-llm bench PKG``."""

import sys

from .run import main

if len(sys.argv) < 2:
    print("usage: python -m fused_llm_dev.bench <package> [options]", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[1], sys.argv[2:]))
