"""The Qwen2 model, `make` and command line shared by the PyTorch sides of `npm run bench:native`:
bench/native/torch_step.py (CPU, fp32) and bench/native/torch_gpu.py (GPU, bf16); their
docstrings say what each computes. Both import this file by path, as they import
test/native/make_fixtures.py, whose parameter names, shapes and safetensors writer/reader
this uses (and re-exports).

Qwen2ForCausalLM(cfg, dtype, sdpa, recompute) is Hugging Face's Qwen2ForCausalLM, module and
parameter names included, computing in `dtype`:
  * Every forward casts each weight to `dtype` (w.to(dtype): the weight itself when it
    already is `dtype`, as in fp32; otherwise its backward hands the gradient back in the
    parameter's dtype), so all activations are `dtype`. Embedding lookup, then per layer:
    RMSNorm as Hugging Face's Qwen2RMSNorm (fp32 statistics, the output cast to `dtype` times
    the weight), q/k/v projections with biases, rotate-half RoPE (fp32 angles, cos/sin cast
    to `dtype`), GQA by repeat_interleave of k and v, attention, o_proj, residual, RMSNorm,
    SwiGLU MLP (separate gate/up/down), residual; final RMSNorm; logits = hidden @ lm_head^T
    (the tied embedding when tied), [B, T, V] in `dtype`.
  * Attention: sdpa=False, Hugging Face's eager code: matmul, / sqrt(head_dim), + additive
    causal mask (-inf above the diagonal), softmax, matmul. sdpa=True:
    torch.nn.functional.scaled_dot_product_attention(is_causal=True).
  * forward(input_ids, attention_mask): with a padding mask ([B, T], 1 = real token; left,
    right or both), as Hugging Face runs a padded batch: position ids = real tokens before
    the token (verl's compute_position_id_with_mask), and each query attends to the real
    keys at or before it (the additive mask holds finfo.min, not -inf, as Hugging Face's
    does; SDPA gets it as a boolean mask). A padded query, which would see no key, attends
    to itself, so nothing turns into NaN; its output is never used.
  * recompute=True: torch.utils.checkpoint (use_reentrant=False) around each decoder layer.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "native"))
# make_fixtures pins torch to one thread when imported; the scripts set the count afterwards.
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
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * xf.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Linear(nn.Module):
    """nn.Linear's parameters, computing with their cast to the input's dtype."""

    def __init__(self, inp, out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, inp))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None

    def forward(self, x):
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


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

    def forward(self, x, cos, sin, mask):
        """mask: the additive mask for eager attention; for SDPA, None (causal) or the
        boolean mask of the keys each query may see."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # [B,NH,T,hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B,NKV,T,hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h reads kv head h // (NH / NKV) (HF's repeat_kv).
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif mask.dtype == torch.bool:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
            out = scores.softmax(-1) @ v  # [B,NH,T,hd]
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
        self.theta, self.hd = cfg["rope_theta"], hd


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg, dtype=torch.float32, sdpa=False, recompute=False):
        super().__init__()
        self.model = Qwen2Model(cfg)
        tied = cfg["tie_word_embeddings"]
        self.lm_head = None if tied else Linear(cfg["hidden_size"], cfg["vocab_size"], False)
        self.dtype, self.sdpa, self.recompute = dtype, sdpa, recompute

    def forward(self, input_ids, attention_mask=None):
        m = self.model
        T, dev = input_ids.shape[1], input_ids.device
        inv_freq = 1.0 / m.theta ** (torch.arange(0, m.hd, 2, device=dev).float() / m.hd)
        if attention_mask is None:
            freqs = torch.outer(torch.arange(T, device=dev).float(), inv_freq)  # [T,hd/2]
            mask = None if self.sdpa else torch.full((T, T), float("-inf"), device=dev).triu(1)
        else:
            real = attention_mask.bool()
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B,T]
            freqs = (positions.float()[..., None] * inv_freq)[:, None]  # [B,1,T,hd/2]
            causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
            eye = torch.eye(T, dtype=torch.bool, device=dev)
            allowed = (causal & real[:, None, None, :]) | eye  # [B,1,T,T]
            mask = allowed if self.sdpa else torch.zeros(
                allowed.shape, dtype=self.dtype, device=dev).masked_fill(
                ~allowed, torch.finfo(self.dtype).min)
        emb = torch.cat((freqs, freqs), dim=-1)
        # [T,hd] or [B,1,T,hd], broadcast over [B,NH,T,hd]
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        wte = m.embed_tokens.weight.to(self.dtype)  # one cast serves the lookup and a tied head
        x = F.embedding(input_ids, wte)
        for layer in m.layers:
            if self.recompute:
                x = checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        x = m.norm(x)
        head = wte if self.lm_head is None else self.lm_head.weight.to(self.dtype)
        return F.linear(x, head)  # [B,T,V]


def load(model_dir, **kw):
    """The model folder's config and Qwen2ForCausalLM(config, **kw) holding its weights."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights, _ = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model = Qwen2ForCausalLM(cfg, **kw)
    model.load_state_dict(weights, strict=True)
    return model, cfg


# ---------------------------------------------------------------------------
# make and the command line
# ---------------------------------------------------------------------------

def make(args, rope_theta, max_positions, torch_dtype):
    """`make`: a seeded random Qwen2 folder args.out/model (config.json + model.safetensors,
    weights normal(0, INIT_STD), RMSNorm weights 1, stored as torch_dtype "float32" or
    "bfloat16") and a batch args.out/data.safetensors (input_ids I64 [B, T], uniformly random
    tokens); prints {"params": N}."""
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
        "rope_theta": rope_theta,
        "tie_word_embeddings": args.tied,
        "max_position_embeddings": max_positions,
        "torch_dtype": torch_dtype,
        "hidden_act": "silu",
    }
    dtype = {"float32": "F32", "bfloat16": "BF16"}[torch_dtype]
    gen = torch.Generator().manual_seed(args.seed)
    tensors, total = [], 0
    for name, shape, kind in param_specs(cfg):
        t = torch.ones(shape) if kind == "norm" else INIT_STD * torch.randn(shape, generator=gen)
        tensors.append((name, dtype, t))
        total += t.numel()
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    write_json(os.path.join(model_dir, "config.json"), cfg)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), dtype=torch.int64, generator=gen)
    write_safetensors(os.path.join(args.out, "data.safetensors"), [("input_ids", "I64", ids)])
    print(json.dumps({"params": total}))


def parser(doc, check, make, train, train_options):
    """The scripts' argparse parser and its subparsers, holding check, make and train (whose
    own options train_options(train's subparser) adds between --steps and --lr); each mode
    runs as args.fn(args)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
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
    train_options(t)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    return ap, sub
