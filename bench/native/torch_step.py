#!/usr/bin/env python3
"""The PyTorch side of `npm run bench:native` (bench/native/run.ts runs it; see there).

  torch_step.py check
  torch_step.py make --out DIR --vocab V --hidden H --intermediate I --layers L
                     --heads NH --kv-heads NKV [--tied] --batch B --seq T [--seed S]
  torch_step.py train --model DIR --data FILE --steps N --threads N
                      [--lr X] [--weight-decay X] [--max-grad-norm X]

check  prints {"torch", "python", "blas"} as JSON (exit 3 when torch is missing).
make   writes a random fp32 Qwen2 folder DIR/model (config.json + model.safetensors) and a
       batch DIR/data.safetensors (input_ids I64 [B, T], every token real), both seeded, so
       the native trainer and this script read the very same files; prints {"params": N}.
train  runs the same training step as `searchr1-trainer sft`, N times on the whole batch:
       forward, token-mean cross-entropy of the next tokens, backward, global grad-norm
       clipping, AdamW. Prints one JSON line per step, as the trainer's --metrics file:
       {"step","loss","grad_norm","lr","tokens","seconds"}; `seconds` is the step's wall time.

The model is Hugging Face's Qwen2ForCausalLM as its eager ("attn_implementation=eager")
code runs it in fp32: nn.Linear layers, RMSNorm, rotate-half RoPE, GQA by repeating the
key/value heads, attention as matmul + additive causal mask + softmax + matmul (PyTorch
1.13 has no scaled_dot_product_attention), SwiGLU MLP, full [B, T, V] logits and
F.cross_entropy. Parameter names, shapes and the safetensors writer/reader come from the
native tests' reference script, test/native/make_fixtures.py.
"""

import argparse
import json
import math
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    print("torch_step.py: the Python module 'torch' is missing "
          "(Debian/Ubuntu: apt-get install -y python3-torch libopenblas0)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "native"))
# make_fixtures pins torch to one thread when imported; `train` sets the count afterwards.
from make_fixtures import param_specs, read_safetensors, write_json, write_safetensors  # noqa: E402

# Hugging Face's default initializer_range: weights (and biases) ~ normal(0, 0.02).
INIT_STD = 0.02


# ---------------------------------------------------------------------------
# Model (module and parameter names are Hugging Face's, so the checkpoint loads as is)
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = H // self.nh
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=True)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=True)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=True)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # [B,NH,T,hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B,NKV,T,hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h reads kv head h // (NH / NKV) (HF's repeat_kv).
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        out = scores.softmax(-1) @ v  # [B,NH,T,hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

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

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        freqs = torch.outer(torch.arange(T).float(), self.inv_freq)  # [T,hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # [T,hd], broadcast over [B,NH,T,hd]
        mask = torch.full((T, T), float("-inf")).triu(1)  # causal, additive
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = Qwen2Model(cfg)
        tied = cfg["tie_word_embeddings"]
        self.lm_head = None if tied else nn.Linear(cfg["hidden_size"], cfg["vocab_size"],
                                                   bias=False)

    def forward(self, input_ids):
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(self.model(input_ids), head.weight)  # [B,T,V]


# ---------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------

def check(_args):
    # The BLAS torch's matmuls run on: Debian's torch links the libblas.so.3 alternative,
    # OpenBLAS (.../openblas-pthread/) or the slow reference BLAS (.../blas/).
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    blas = {line.split()[-1] for line in maps.splitlines() if "/libblas.so" in line}
    print(json.dumps({
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "blas": " ".join(sorted(blas)) or "unknown",
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
        "rope_theta": 10000.0,
        "tie_word_embeddings": args.tied,
        "max_position_embeddings": args.seq,
        "torch_dtype": "float32",
        "hidden_act": "silu",
    }
    torch.manual_seed(args.seed)
    tensors, total = [], 0
    for name, shape, kind in param_specs(cfg):
        t = torch.ones(shape) if kind == "norm" else INIT_STD * torch.randn(shape)
        tensors.append((name, "F32", t))
        total += t.numel()
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    write_json(os.path.join(model_dir, "config.json"), cfg)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), dtype=torch.int64)
    write_safetensors(os.path.join(args.out, "data.safetensors"), [("input_ids", "I64", ids)])
    print(json.dumps({"params": total}))


def train(args):
    # OpenMP (ATen) threads; the BLAS library's own pool follows OPENBLAS_NUM_THREADS,
    # which run.ts sets to the same count.
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    weights, _ = read_safetensors(os.path.join(args.model, "model.safetensors"))
    model = Qwen2ForCausalLM(cfg)
    model.load_state_dict(weights, strict=True)
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
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--max-grad-norm", type=float, default=1.0)

    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
