#!/usr/bin/env python3
"""The transformers side of `npm run bench:dense`'s encoder rows (bench/dense/run.ts runs it).

  hf_encode.py check
  hf_encode.py make --out DIR --vocab V --hidden H --intermediate I --layers L --heads NH
                    --max-positions P [--seed S]
  hf_encode.py encode --model DIR --input FILE --out FILE --threads N --batch-size B
                      [--repeat R]

check   prints {"torch", "transformers", "python", "blas"} as JSON.
make    writes a seeded random fp32 BertModel (transformers' own initialisation; BertConfig
        with hidden_act "gelu", absolute positions, 2 token types, layer_norm_eps 1e-12) as a
        Hugging Face folder with save_pretrained (config.json + model.safetensors). A random
        model is as fast as a trained one. Prints {"params", "seconds"}.
encode  the competitor, as Search-R1's retrieval Encoder computes embeddings: AutoModel
        (fp32, CPU, eval, the default attention implementation), torch.set_num_threads(N),
        under torch.no_grad(): model(input_ids=..., attention_mask=..., return_dict=True),
        then Search-R1's mean pooling (last_hidden_state.masked_fill(~mask, 0).sum(1) /
        mask.sum(1)) and torch.nn.functional.normalize(dim=-1). FILE is a safetensors file
        with 'input_ids' and 'attention_mask' (I32/I64 [rows, T]); the rows go through in
        slices of B, as our side's --batch-size. One untimed forward of the first 8 rows
        warms up; then R timed passes over all rows (the forward, pooling and
        normalisation; no tokenizer: the ids are given). Writes the embeddings of the last
        pass to OUT ('embeddings', F32 [rows, H]) and prints {"seconds" (best pass),
        "passes", "rows", "attn_implementation"}.

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
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel, BertConfig, BertModel
except ImportError as err:
    print(f"hf_encode.py: {err} (needs torch and transformers: pip install torch transformers)",
          file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_stack import stack  # noqa: E402 (in bench/, the parent of this script's folder)

WARMUP_ROWS = 8


def cmd_check(_args):
    print(json.dumps(stack(torch, transformers)))


def cmd_make(args):
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    cfg = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                     intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                     num_attention_heads=args.heads, max_position_embeddings=args.max_positions,
                     type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
    model = BertModel(cfg).to(torch.float32).eval()
    model.save_pretrained(args.out, safe_serialization=True)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()),
                      "seconds": time.perf_counter() - start}))


def pooling(last_hidden_state, attention_mask):
    """Search-R1's `pooling(..., pooling_method="mean")`."""
    last_hidden = last_hidden_state.masked_fill(~attention_mask[..., None].bool(), 0.0)
    return last_hidden.sum(dim=1) / attention_mask.sum(dim=1)[..., None]


@torch.no_grad()
def embed(model, ids, mask):
    output = model(input_ids=ids, attention_mask=mask, return_dict=True)
    return torch.nn.functional.normalize(pooling(output.last_hidden_state, mask), dim=-1)


def cmd_encode(args):
    torch.set_num_threads(args.threads)
    model = AutoModel.from_pretrained(args.model, dtype=torch.float32).eval()
    tensors = load_file(args.input)
    ids = tensors["input_ids"].to(torch.long)
    mask = tensors["attention_mask"].to(torch.long)
    b = args.batch_size
    embed(model, ids[:WARMUP_ROWS], mask[:WARMUP_ROWS])  # warm-up
    passes = []
    out = None
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = torch.cat([embed(model, ids[i:i + b], mask[i:i + b])
                         for i in range(0, ids.shape[0], b)])
        passes.append(time.perf_counter() - t)
    save_file({"embeddings": out.contiguous()}, args.out)
    print(json.dumps({"seconds": min(passes), "passes": passes, "rows": int(ids.shape[0]),
                      "attn_implementation": getattr(model.config, "_attn_implementation",
                                                     None)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--vocab", type=int, default=30522)
    m.add_argument("--hidden", type=int, default=768)
    m.add_argument("--intermediate", type=int, default=3072)
    m.add_argument("--layers", type=int, default=12)
    m.add_argument("--heads", type=int, default=12)
    m.add_argument("--max-positions", type=int, default=512)
    m.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("encode")
    e.add_argument("--model", required=True)
    e.add_argument("--input", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--threads", type=int, required=True)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    {"check": cmd_check, "make": cmd_make, "encode": cmd_encode}[args.cmd](args)


if __name__ == "__main__":
    main()
