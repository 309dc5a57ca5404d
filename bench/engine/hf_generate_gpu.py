#!/usr/bin/env python3
"""The Hugging Face side of `npm run bench:engine -- --gpu` (bench/engine/gpu.ts runs it; see
there). The random models are written by hf_generate.py `make --dtype bfloat16`.

  hf_generate_gpu.py check
  hf_generate_gpu.py generate --model DIR --work FILE

check     prints {"torch", "transformers", "python", "cuda", "gpu", "reason"} as JSON: cuda
          is whether this torch can use a GPU, gpu its name, reason why not.
generate  the competitor: loads DIR with AutoModelForCausalLM in bf16 (dtype=torch.bfloat16,
          the default attention implementation, which is SDPA; no torch.compile, no static
          cache) onto cuda:0, and for each workload of the JSON file FILE ({"workloads":
          [{"name", "prompts": [[ids]], "max_new_tokens"}]}) runs ONE model.generate call
          over all its prompts: greedy (do_sample=False, num_beams=1), eos_token_id=None so
          that every row runs exactly max_new_tokens (our side: ignore_eos); several prompts
          form one batch, left-padded with an attention mask (a DynamicCache, generate's
          default). One untimed generate of 4 tokens over two 8-token prompts (the first 8
          tokens of the first workload's first and last prompts) warms up first.
          seconds: from torch.cuda.synchronize() before the call (the prompt ids are moved
          to the GPU inside the timed span) to torch.cuda.synchronize() after it.
          first_token_s: from the same start to the first call of a logits processor, which
          synchronises the GPU once, at that first call (generate's step loop already
          synchronises every step for its stopping check, so this adds no wait of its own):
          the moment the prefill's logits, hence every row's first token, exist.
          Prints {"attn_implementation", "workloads": [{"name", "seconds", "first_token_s",
          "rows", "new_tokens"}]}; a workload that runs out of GPU memory gets {"name",
          "error"} instead, and the next one still runs.

Exit status 3 when torch or transformers cannot be imported, 4 when this torch has no GPU.
"""

import argparse
import json
import os
import platform
import sys
import time

try:
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, GenerationConfig, LogitsProcessor,
                              LogitsProcessorList)
except ImportError as err:
    print(f"hf_generate_gpu.py: {err} (needs torch and transformers: "
          "pip install torch transformers)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_generate import PAD, left_padded  # noqa: E402 (beside this script)

NO_GPU = 4


def cmd_check(_args):
    cuda = torch.cuda.is_available()
    print(json.dumps({
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else "",
        "reason": "" if cuda else (
            "this torch was built without CUDA" if torch.version.cuda is None
            else "torch sees no GPU"),
    }))


class FirstStep(LogitsProcessor):
    """Notes when the first step's logits exist (one synchronisation); scores untouched."""

    def __init__(self):
        self.at = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            torch.cuda.synchronize()
            self.at = time.perf_counter()
        return scores


def run_generate(model, prompts, max_new_tokens, probe=None):
    """Returns (the new tokens [rows, max_new_tokens], the start, the seconds)."""
    ids, mask = left_padded(prompts)
    gen = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                           eos_token_id=None, pad_token_id=PAD, use_cache=True)
    processors = LogitsProcessorList([probe] if probe is not None else [])
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        ids, mask = ids.cuda(), mask.cuda()
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen,
                             logits_processor=processors)
    torch.cuda.synchronize()
    return out[:, ids.shape[1]:], start, time.perf_counter() - start


def cmd_generate(args):
    if not torch.cuda.is_available():
        print("hf_generate_gpu.py: this torch cannot use a GPU", file=sys.stderr)
        sys.exit(NO_GPU)
    with open(args.work) as f:
        work = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    first = work["workloads"][0]["prompts"]
    run_generate(model, [first[0][:8], first[-1][:8]], 4)  # warm-up, untimed
    results = []
    for w in work["workloads"]:
        probe = FirstStep()
        try:
            out, start, seconds = run_generate(model, w["prompts"], w["max_new_tokens"], probe)
        except torch.cuda.OutOfMemoryError as e:
            results.append({"name": w["name"],
                            "error": f"out of GPU memory: {str(e).splitlines()[0]}"})
            torch.cuda.empty_cache()
            continue
        if out.shape[1] != w["max_new_tokens"]:
            raise SystemExit(f"hf_generate_gpu.py: {w['name']}: generate returned "
                             f"{out.shape[1]} tokens per row, expected {w['max_new_tokens']}")
        results.append({
            "name": w["name"],
            "seconds": seconds,
            "first_token_s": probe.at - start,
            "rows": out.shape[0],
            "new_tokens": out.shape[1],
        })
        del out
    print(json.dumps({"attn_implementation": model.config._attn_implementation,
                      "workloads": results}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    gen = sub.add_parser("generate")
    gen.add_argument("--model", required=True)
    gen.add_argument("--work", required=True)
    args = ap.parse_args()
    {"check": cmd_check, "generate": cmd_generate}[args.cmd](args)


if __name__ == "__main__":
    main()
