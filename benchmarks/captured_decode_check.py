"""Tokens and ms a step of kernelized Llama-3-8B-shaped models (bf16 and 4-bit) with and
without ``fused_llm.captured_decode``, in one run (GPU only):

    python benchmarks/captured_decode_check.py [--layers 2] [--rounds 3] [--out FILE.json]

Each model generates greedily from a 1 x 128 prompt with a static cache; the tokens of 64 new
tokens are compared, and the time a step is ``fused-llm bench e2e``'s (the difference of a 64-
and a 16-token generate over 48), the median of ``--rounds``, after one warm-up generate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _tokens(model, ids, new_tokens: int, cache) -> torch.Tensor:
    with torch.inference_mode():
        cache.reset()
        return model.generate(ids, past_key_values=cache, do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0)  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="captured_decode_check.json")
    args = parser.parse_args(argv)

    import transformers
    from transformers import StaticCache

    import fused_llm
    from fused_llm import captured_decode
    from fused_llm_dev.bench.e2e import _step_ms
    from fused_llm_dev.models import build_model

    result = {"metadata": {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                           "layers": args.layers, "rounds": args.rounds}}  # fmt: skip
    for kind in ("bf16", "w4"):
        model = build_model("llama", args.layers, "cuda", torch.bfloat16, 0)
        if kind == "w4":
            fused_llm.quantize_w4a16(model, group_size=128)
        fused_llm.kernelize(model)
        ids = torch.randint(1, 1000, (1, 128), device="cuda")
        cache = StaticCache(config=model.config, max_cache_len=128 + 65)
        runs = {}
        for capture in (False, True):
            (captured_decode.enable if capture else captured_decode.disable)(model)
            _tokens(model, ids, 64, cache)  # warm-up: the compile and the capture
            tokens = _tokens(model, ids, 64, cache)
            steps = [_step_ms(model, ids, 16, 64, cache) for _ in range(args.rounds)]
            runs[capture] = (tokens, steps)
        states = model.__dict__.get(captured_decode._STATES, {})
        result[kind] = {
            "same_tokens": torch.equal(runs[False][0], runs[True][0]),
            "ms_step_transformers": statistics.median(runs[False][1]),
            "ms_step_captured": statistics.median(runs[True][1]),
            "rounds_transformers": runs[False][1],
            "rounds_captured": runs[True][1],
            "graphs": [type(state.graph).__name__ for state in states.values()],
        }
        print(kind, json.dumps(result[kind]))
        del model, cache
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
