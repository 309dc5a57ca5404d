#!/usr/bin/env python3
"""The PyTorch side of `npm run bench:native` (bench/native/run.ts runs it; see there).

  torch_step.py check
  torch_step.py make --out DIR --vocab V --hidden H --intermediate I --layers L
                     --heads NH --kv-heads NKV [--tied] --batch B --seq T [--seed S]
  torch_step.py train --model DIR --data FILE --steps N --threads N
                      [--lr X] [--weight-decay X] [--max-grad-norm X]

check  prints {"torch", "python", "blas"} as JSON (exit 3 when torch is missing); blas is
       the libblas.so it loaded (Debian's torch) or its build's BLAS_INFO (mkl for pip's).
make   writes a random fp32 Qwen2 folder DIR/model (config.json + model.safetensors) and a
       batch DIR/data.safetensors (input_ids I64 [B, T], every token real), both seeded, so
       the native trainer and this script read the very same files; prints {"params": N}.
train  runs the same training step as `searchr1-trainer sft`, N times on the whole batch:
       forward, token-mean cross-entropy of the next tokens, backward, global grad-norm
       clipping, AdamW. Prints one JSON line per step, as the trainer's --metrics file:
       {"step","loss","grad_norm","lr","tokens","seconds"}; `seconds` is the step's wall time.

The model is Hugging Face's Qwen2ForCausalLM as its eager ("attn_implementation=eager")
code runs it in fp32: linear layers (F.linear), RMSNorm, rotate-half RoPE, GQA by repeating
the key/value heads, attention as matmul + additive causal mask + softmax + matmul (PyTorch
1.13 has no scaled_dot_product_attention), SwiGLU MLP, full [B, T, V] logits and
F.cross_entropy. The model, `make` and the command line are bench/native/torch_qwen2.py's
(Qwen2ForCausalLM in fp32 with eager attention), shared with torch_gpu.py. Parameter names,
shapes and the safetensors writer/reader come from the native tests' reference script,
test/native/make_fixtures.py.
"""

import json
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_step.py: the Python module 'torch' is missing "
          "(Debian/Ubuntu: apt-get install -y python3-torch libopenblas0)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The model, `make` and the command line, shared with torch_gpu.py; it imports
# test/native/make_fixtures.py, which pins torch to one thread: `train` sets the count afterwards.
import torch_qwen2  # noqa: E402
from torch_qwen2 import read_safetensors  # noqa: E402


# ---------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------

def check(_args):
    # The BLAS torch's matmuls run on: Debian's torch links the libblas.so.3 alternative,
    # OpenBLAS (.../openblas-pthread/) or the slow reference BLAS (.../blas/).
    # pip's wheels link MKL statically: their build's BLAS_INFO says so.
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    blas = {line.split()[-1] for line in maps.splitlines() if "/libblas.so" in line}
    info = [w.split("=", 1)[1].rstrip(",") for w in torch.__config__.show().split()
            if w.startswith("BLAS_INFO=")]
    print(json.dumps({
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "blas": " ".join(sorted(blas)) or " ".join(info) or "unknown",
    }))


def make(args):
    torch_qwen2.make(args, rope_theta=10000.0, max_positions=args.seq, torch_dtype="float32")


def train(args):
    # OpenMP (ATen) threads; the BLAS library's own pool follows OPENBLAS_NUM_THREADS,
    # which run.ts sets to the same count.
    torch.set_num_threads(args.threads)
    model, cfg = torch_qwen2.load(args.model)  # fp32, eager attention
    data, _ = read_safetensors(args.data)
    ids = data["input_ids"]
    V = cfg["vocab_size"]
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)
    tokens = ids.shape[0] * (ids.shape[1] - 1)  # predicted tokens
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        seconds = time.perf_counter() - start
        print(json.dumps({"step": step, "loss": loss.item(), "grad_norm": norm.item(),
                          "lr": args.lr, "tokens": tokens, "seconds": seconds}), flush=True)


def main():
    def train_options(t):
        t.add_argument("--threads", type=int, required=True)

    ap, _ = torch_qwen2.parser(__doc__, check, make, train, train_options)
    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
