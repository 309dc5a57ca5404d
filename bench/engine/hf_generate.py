#!/usr/bin/env python3
"""The Hugging Face side of `npm run bench:engine` (bench/engine/run.ts runs it; see there).

  hf_generate.py check
  hf_generate.py make --out DIR --vocab V --hidden H --intermediate I --layers L --heads NH
                      --kv-heads NKV [--tied] [--rope-theta T] [--max-positions P] [--seed S]
                      [--dtype float32|bfloat16]
  hf_generate.py generate --model DIR --work FILE --threads N

check     prints {"torch", "transformers", "python", "blas"} as JSON.
make      writes a seeded random Qwen2ForCausalLM as a Hugging Face folder with
          transformers' own save_pretrained (config.json, safetensors, generation_config.json)
          in --dtype (default float32; bench:engine --gpu writes bfloat16).
          Weights: transformers' initialisation (matrices ~ normal(0, 0.02)), then q/k/v
          biases ~ normal(0, 0.02) and RMSNorm weights 1 + 0.1 * normal, so that neither is
          the trivial value and both sides must really apply them (all drawn in fp32 on the
          CPU, then rounded to --dtype). config.json also gets a top-level rope_theta equal
          to rope_parameters' (transformers 5 writes only the latter; older readers take the
          former). eos_token_id is 1; the benchmark ignores it.
          Prints {"params", "seconds"}.
generate  the competitor: loads DIR with AutoModelForCausalLM (fp32, the default attention
          implementation, which is SDPA), torch.set_num_threads(N), and for each workload of
          the JSON file FILE ({"workloads": [{"name", "prompts": [[ids]], "max_new_tokens"}]})
          runs ONE model.generate call over all its prompts: greedy (do_sample=False,
          num_beams=1), eos_token_id=None so that every row runs exactly max_new_tokens
          (our side: ignore_eos); several prompts form one batch, left-padded with an
          attention mask. One untimed 4-token generate warms up first. A logits processor
          (which returns the scores untouched) notes for every step its time and, per row, the
          gap between the two largest logits and the log-softmax of the largest (the greedy
          token's log-prob), so the benchmark can compare log-probs and tell a near-tie from a
          real disagreement. Prints {"attn_implementation", "workloads": [{"name", "seconds",
          "first_token_s", "tokens", "gaps", "logprobs"}]}; seconds = wall time of the
          generate call; first_token_s = until the first step's logits (prefill).

Exit status 3 when torch or transformers cannot be imported.
"""

import argparse
import json
import os
import sys
import time

try:
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, GenerationConfig, LogitsProcessor,
                              LogitsProcessorList, Qwen2Config, Qwen2ForCausalLM)
except ImportError as err:
    print(f"hf_generate.py: {err} (needs torch and transformers: pip install torch transformers)",
          file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_stack import stack  # noqa: E402 (in bench/, the parent of this script's folder)

EOS = 1
PAD = 0
INIT_STD = 0.02
NORM_STD = 0.1


def cmd_check(_args):
    print(json.dumps(stack(torch, transformers)))


def cmd_make(args):
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    cfg = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, tie_word_embeddings=args.tied,
        max_position_embeddings=args.max_positions, rope_theta=args.rope_theta,
        rms_norm_eps=1e-6, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD,
        initializer_range=INIT_STD)
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.normal_(0.0, INIT_STD)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * torch.randn_like(p))
    model.to(getattr(torch, args.dtype))
    model.generation_config = GenerationConfig(bos_token_id=EOS, eos_token_id=EOS,
                                               pad_token_id=PAD)
    model.save_pretrained(args.out)
    path = f"{args.out}/config.json"
    with open(path) as f:
        config = json.load(f)
    config["rope_theta"] = args.rope_theta
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"params": params, "seconds": time.perf_counter() - start}))


class StepProbe(LogitsProcessor):
    """Notes each step's time, and per row the top-2 logit gap and the top log-prob."""

    def __init__(self):
        self.times, self.gaps, self.logprobs = [], [], []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        top = torch.topk(scores, 2, dim=-1).values
        self.gaps.append((top[:, 0] - top[:, 1]).tolist())
        self.logprobs.append((top[:, 0] - torch.logsumexp(scores, dim=-1)).tolist())
        return scores


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def run_generate(model, prompts, max_new_tokens, probe=None):
    ids, mask = left_padded(prompts)
    gen = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                           eos_token_id=None, pad_token_id=PAD, use_cache=True)
    processors = LogitsProcessorList([probe] if probe is not None else [])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen,
                             logits_processor=processors)
    return out[:, ids.shape[1]:]


def cmd_generate(args):
    torch.set_num_threads(args.threads)
    with open(args.work) as f:
        work = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    run_generate(model, [work["workloads"][0]["prompts"][0][:8]], 4)  # warm-up, untimed
    results = []
    for w in work["workloads"]:
        probe = StepProbe()
        start = time.perf_counter()
        out = run_generate(model, w["prompts"], w["max_new_tokens"], probe)
        seconds = time.perf_counter() - start
        if out.shape[1] != w["max_new_tokens"]:
            raise SystemExit(f"hf_generate.py: {w['name']}: generate returned {out.shape[1]} "
                             f"tokens per row, expected {w['max_new_tokens']}")
        rows = len(w["prompts"])
        results.append({
            "name": w["name"],
            "seconds": seconds,
            "first_token_s": probe.times[0] - start,
            "tokens": out.tolist(),
            # [row][step]
            "gaps": [[probe.gaps[s][r] for s in range(len(probe.gaps))] for r in range(rows)],
            "logprobs": [[probe.logprobs[s][r] for s in range(len(probe.logprobs))]
                         for r in range(rows)],
        })
    print(json.dumps({"attn_implementation": model.config._attn_implementation,
                      "workloads": results}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    mk = sub.add_parser("make")
    mk.add_argument("--out", required=True)
    for name in ("vocab", "hidden", "intermediate", "layers", "heads", "kv-heads"):
        mk.add_argument(f"--{name}", type=int, required=True)
    mk.add_argument("--tied", action="store_true")
    mk.add_argument("--rope-theta", type=float, default=1e6)
    mk.add_argument("--max-positions", type=int, default=32768)
    mk.add_argument("--seed", type=int, default=1234)
    mk.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    gen = sub.add_parser("generate")
    gen.add_argument("--model", required=True)
    gen.add_argument("--work", required=True)
    gen.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()
    {"check": cmd_check, "make": cmd_make, "generate": cmd_generate}[args.cmd](args)


if __name__ == "__main__":
    main()
