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

Parameter names, shapes and the safetensors writer/reader come from the native tests'
reference script, test/native/make_fixtures.py.
"""

import argparse
import json
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint
except ImportError:
    print("torch_gpu.py: the Python module 'torch' is missing", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "native"))
from make_fixtures import param_specs, read_safetensors, write_json, write_safetensors  # noqa: E402

# make_fixtures pins torch to one thread for reproducible fixtures; generating and reading
# billions of weights wants every core (the values do not depend on the thread count).
torch.set_num_threads(os.cpu_count() or 1)

BF16 = torch.bfloat16
INIT_STD = 0.02  # Hugging Face's default initializer_range
OOM_EXIT = 4


def bf(w):
    return w.to(BF16)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return bf(self.weight) * xf.to(BF16)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Linear(nn.Module):
    """nn.Linear's parameters, computing with their bf16 cast."""

    def __init__(self, inp, out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, inp))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None

    def forward(self, x):
        return F.linear(x, bf(self.weight), None if self.bias is None else bf(self.bias))


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = H // self.nh
        self.q_proj = Linear(H, self.nh * self.hd, True)
        self.k_proj = Linear(H, self.nkv * self.hd, True)
        self.v_proj = Linear(H, self.nkv * self.hd, True)
        self.o_proj = Linear(self.nh * self.hd, H, False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = Linear(H, I, False)
        self.up_proj = Linear(H, I, False)
        self.down_proj = Linear(I, H, False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.theta, self.hd = cfg["rope_theta"], hd


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg, recompute=False):
        super().__init__()
        self.model = Qwen2Model(cfg)
        tied = cfg["tie_word_embeddings"]
        self.lm_head = None if tied else Linear(cfg["hidden_size"], cfg["vocab_size"], False)
        self.recompute = recompute

    def forward(self, input_ids):
        m = self.model
        T, dev = input_ids.shape[1], input_ids.device
        inv_freq = 1.0 / m.theta ** (torch.arange(0, m.hd, 2, device=dev).float() / m.hd)
        freqs = torch.outer(torch.arange(T, device=dev).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = bf(emb.cos()), bf(emb.sin())
        wte = bf(m.embed_tokens.weight)  # one cast serves the lookup and a tied head
        x = F.embedding(input_ids, wte)
        for layer in m.layers:
            if self.recompute:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = m.norm(x)
        head = wte if self.lm_head is None else bf(self.lm_head.weight)
        return F.linear(x, head)  # [B, T, V] bf16


def load(model_dir, **kw):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights, _ = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model = Qwen2ForCausalLM(cfg, **kw)
    model.load_state_dict(weights, strict=True)
    return model, cfg


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
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": args.tied,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    }
    gen = torch.Generator().manual_seed(args.seed)
    tensors, total = [], 0
    for name, shape, kind in param_specs(cfg):
        t = torch.ones(shape) if kind == "norm" else INIT_STD * torch.randn(shape, generator=gen)
        tensors.append((name, "BF16", t))
        total += t.numel()
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    write_json(os.path.join(model_dir, "config.json"), cfg)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), dtype=torch.int64, generator=gen)
    write_safetensors(os.path.join(args.out, "data.safetensors"), [("input_ids", "I64", ids)])
    print(json.dumps({"params": total}))


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("check").set_defaults(fn=check)

    m = sub.add_parser("make")
    m.set_defaults(fn=make)
    m.add_argument("--out", required=True)
    for name in ("vocab", "hidden", "intermediate", "layers", "heads", "kv-heads", "batch",
                 "seq"):
        m.add_argument(f"--{name}", type=int, required=True)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train")
    t.set_defaults(fn=train)
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--micro-batch-size", type=int, default=0)
    t.add_argument("--recompute", action="store_true")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--max-grad-norm", type=float, default=1.0)

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
