#!/usr/bin/env python3
"""The PyTorch side of `npm run bench:native -- --gpu` (bench/native/run.ts runs it; see
bench/native/gpu.ts).

  torch_gpu.py check
  torch_gpu.py make --out DIR --vocab V --hidden H --intermediate I --layers L
                    --heads NH --kv-heads NKV [--tied] --batch B --seq T [--seed S]
  torch_gpu.py train --model DIR --data FILE --steps N [--micro-batch-size M] [--recompute]
                     [--lr X] [--weight-decay X] [--max-grad-norm X]
  torch_gpu.py score --model DIR --data FILE --repeat K

check  prints {"torch", "python", "cuda", "gpu", "reason"} as JSON: cuda says whether this
       torch can run on a GPU, and reason why not (exit 3 when torch is missing).
make   writes a seeded random Qwen2 folder DIR/model in bf16 (config.json + one
       model.safetensors; weights normal(0, 0.02) like Hugging Face's initializer, RMSNorm
       weights 1) and a batch DIR/data.safetensors (input_ids I64 [B, T], uniformly random
       tokens, every token real); prints {"params": N}. Needs torch, not a GPU.
train  the training step `searchr1-trainer sft --device cuda` runs, N times on the whole
       batch, in PyTorch eager on the GPU. Prints one JSON line per step:
       {"step","loss","grad_norm","lr","tokens","seconds","peak_memory_mb"}.
score  the forward pass of `searchr1-trainer score` K times: per-token log-probs and
       entropies of the batch. Prints {"pass","seconds","peak_memory_mb"} per pass.
Both exit 4 with a message when the GPU runs out of memory.

What `train` computes, exactly:
  * Parameters: fp32 master copies (nn.Parameter, float32) of the bf16 weights on disk.
  * Compute in bf16 without autocast: every forward casts each weight to bf16 (w.to(bf16);
    its backward hands the bf16 gradient back as fp32, accumulated into the fp32 .grad),
    and all activations are bf16. Embedding lookup, then per layer: RMSNorm as Hugging
    Face's Qwen2RMSNorm (fp32 statistics, bf16 output times the bf16 weight), q/k/v
    projections with biases, rotate-half RoPE (fp32 angles, cos/sin cast to bf16), GQA by
    repeat_interleave of k and v, torch.nn.functional.scaled_dot_product_attention(
    is_causal=True), o_proj, residual, RMSNorm, SwiGLU MLP (separate gate/up/down), residual;
    final RMSNorm; logits = hidden @ lm_head^T (the tied embedding when tied) in bf16.
  * Loss: logits upcast to fp32 (as Hugging Face's causal-LM loss does), token-mean
    cross-entropy of the next token over every predicted token of the batch. With
    --micro-batch-size M, the batch runs in B/M slices, each backward adding
    sum-of-token-losses / (all predicted tokens) into the fp32 grads (the same mean).
  * --recompute: torch.utils.checkpoint (use_reentrant=False) around each decoder layer.
  * Then torch.nn.utils.clip_grad_norm_(max 1.0) on the fp32 grads, and
    torch.optim.AdamW over the fp32 parameters (fused=True when this torch has it),
    lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 — as searchr1-trainer sft.
  * `seconds`: wall time from before zero_grad to after the optimizer step, the GPU
    synchronised at both ends. `peak_memory_mb`: torch.cuda.max_memory_allocated() over
    the step (reset at its start); the caching allocator's reserve is not counted.

`score` holds the weights in bf16 only (no masters: nothing trains) and, under
torch.no_grad(), runs the same forward, then log_softmax of the fp32-upcast logits,
gathers the next tokens' log-probs and sums -p·log p for the entropies.

The model (Qwen2ForCausalLM with dtype=bf16, sdpa=True), `make` and the command line are
bench/native/torch_qwen2.py's, shared with torch_step.py. Parameter names, shapes and the
safetensors writer/reader come from the native tests' reference script,
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
    print("torch_gpu.py: the Python module 'torch' is missing", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The model, `make` and the command line, shared with torch_step.py.
import torch_qwen2  # noqa: E402
from torch_qwen2 import read_safetensors  # noqa: E402

# make_fixtures pins torch to one thread for reproducible fixtures; generating and reading
# billions of weights wants every core (the values do not depend on the thread count).
torch.set_num_threads(os.cpu_count() or 1)

BF16 = torch.bfloat16
OOM_EXIT = 4


def load(model_dir, **kw):
    """model_dir's Qwen2ForCausalLM, computing in bf16 with SDPA attention; its parameters are
    float32, holding the file's bf16 values."""
    return torch_qwen2.load(model_dir, dtype=BF16, sdpa=True, **kw)


def sync_seconds(start):
    torch.cuda.synchronize()
    return time.perf_counter() - start


def peak_mb():
    return torch.cuda.max_memory_allocated() / 2**20


# ---------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------

def check(_args):
    cuda = torch.cuda.is_available()
    print(json.dumps({
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else "",
        "reason": "" if cuda else (
            "this torch was built without CUDA" if torch.version.cuda is None
            else "torch sees no GPU"),
    }))


def make(args):
    torch_qwen2.make(args, rope_theta=1000000.0, max_positions=32768, torch_dtype="bfloat16")


def train(args):
    model, cfg = load(args.model, recompute=args.recompute)
    model.cuda()
    data, _ = read_safetensors(args.data)
    ids = data["input_ids"].cuda()
    B, T = ids.shape
    mb = args.micro_batch_size or B
    if B % mb != 0:
        sys.exit(f"torch_gpu.py: --micro-batch-size {mb} must divide the batch size {B}")
    V = cfg["vocab_size"]
    params = list(model.parameters())
    adamw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    try:
        opt = torch.optim.AdamW(params, fused=True, **adamw)
    except (TypeError, RuntimeError):  # a torch without the fused kernel
        opt = torch.optim.AdamW(params, **adamw)
    predicted = B * (T - 1)
    for step in range(1, args.steps + 1):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for b0 in range(0, B, mb):
            part = ids[b0:b0 + mb]
            logits = model(part)
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, V),
                                   part[:, 1:].reshape(-1), reduction="sum") / predicted
            loss.backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        seconds = sync_seconds(start)
        print(json.dumps({"step": step, "loss": float(total), "grad_norm": norm.item(),
                          "lr": args.lr, "tokens": predicted, "seconds": seconds,
                          "peak_memory_mb": peak_mb()}), flush=True)


def score(args):
    model, _ = load(args.model)
    model.to(device="cuda", dtype=BF16)  # the file's bf16 values, exactly
    data, _ = read_safetensors(args.data)
    ids = data["input_ids"].cuda()
    with torch.no_grad():
        for p in range(1, args.repeat + 1):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            logp = model(ids)[:, :-1].float().log_softmax(-1)
            logprobs = logp.gather(-1, ids[:, 1:, None])[..., 0]
            entropy = -(logp.exp() * logp).sum(-1)
            del logp, logprobs, entropy
            seconds = sync_seconds(start)
            print(json.dumps({"pass": p, "seconds": seconds, "peak_memory_mb": peak_mb()}),
                  flush=True)


def main():
    def train_options(t):
        t.add_argument("--micro-batch-size", type=int, default=0)
        t.add_argument("--recompute", action="store_true")

    ap, sub = torch_qwen2.parser(__doc__, check, make, train, train_options)
    s = sub.add_parser("score")
    s.set_defaults(fn=score)
    s.add_argument("--model", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--repeat", type=int, required=True)

    args = ap.parse_args()
    try:
        args.fn(args)
    except torch.cuda.OutOfMemoryError as e:
        print(f"torch_gpu.py {args.mode}: out of GPU memory: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return OOM_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
