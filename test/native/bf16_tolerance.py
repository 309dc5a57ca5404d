"""Measure how far a bf16 computation of the native tests' models lands from float64.

Run from the repository root with Debian's PyTorch (CPU is enough; no GPU needed):

    /usr/bin/python3 test/native/bf16_tolerance.py

The CUDA backend computes as llm.c does: the weights it computes with are the fp32 master
weights rounded to bf16, every activation buffer (and every activation gradient) is bf16,
matmuls multiply bf16 and accumulate in fp32, and norms, softmaxes, log-probs, parameter
gradients and AdamW are fp32. test/native/cuda.test.ts compares its results with float64
references (the PyTorch fixtures) and with the fp32 CPU backend (whose own error, about
1e-6, is negligible beside bf16's). This script emulates that bf16 computation on the CPU
and prints its error against float64, for

  * the fixtures of test/native/make_fixtures.py (whose code it loads by path), against
    their stored references: log-probs, entropies, the weighted loss, every gradient and
    the 10-step AdamW loss curve, run with fp32 masters and torch.optim.AdamW;
  * the random models of test/native/cuda-cases.json, drawn exactly as
    test/native/random-model.ts draws them (same generator, bit for bit), against
    make_fixtures.forward in float64.

Emulation: each buffer the backend stores in bf16 goes through `act`, which rounds the
value (round-to-nearest-even) in the forward pass and the gradient in the backward pass;
weights go through `weight` (value rounded, fp32 gradient); attention is flash-style:
fp32 scores and softmax, probabilities rounded to bf16 for the product with V, and the
score gradient rounded to bf16 for the products that give dQ and dK. The test thresholds
are about 3-4x the largest errors printed here, because a GPU's kernels may round at a
few more or fewer places than this emulation and accumulate in another order.

Error measures (the ones the test applies; "largest errors" at the end is what its
thresholds rest on):
  lp, ent    max over tokens of |a - b| / (1 + |ref|)  (per-element abs + rel, both equal)
  lp_l2      |a - b|_2 / |ref|_2 over all log-probs   (catches small systematic shifts)
  loss       |a - b| / sum |weights * ref log-probs|  (the loss sums terms of both signs)
  grad       max over tensors of max|a - b| / max|ref| (per tensor, like llm.c)
  sft_loss   max over the 10 steps of |a - b|
  sft_norm   max over the 10 steps of |a - b| / ref    (pre-clip gradient norm)
"""

import importlib.util
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The native fixtures' generator, loaded by path (test/ckpt has a make_fixtures.py too).
_spec = importlib.util.spec_from_file_location("native_make_fixtures",
                                               os.path.join(HERE, "make_fixtures.py"))
mf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mf)  # also pins torch to one thread: fixed summation order

F32, F64 = torch.float32, torch.float64


# ---------------------------------------------------------------------------
# bf16 rounding points
# ---------------------------------------------------------------------------

def bf16(x):
    return x.to(torch.bfloat16).to(x.dtype)


class _RoundBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return bf16(x)

    @staticmethod
    def backward(ctx, g):
        return bf16(g)


class _RoundValue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return bf16(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _RoundGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return bf16(g)


class Exact:
    """No rounding: the same model code in float64, to check it against make_fixtures."""
    dtype = F64

    @staticmethod
    def act(x):
        return x

    weight = value = grad = act


class BF16:
    dtype = F32
    act = _RoundBoth.apply      # an activation buffer: value and gradient in bf16
    weight = _RoundValue.apply  # the bf16 compute copy of an fp32 master weight
    value = _RoundValue.apply   # rounded for a matmul, no stored gradient (attention P)
    grad = _RoundGrad.apply     # a gradient rounded for a matmul (attention dS)


# ---------------------------------------------------------------------------
# The model as the backend runs it (native/src/model/qwen2.cpp: fused qkv and gate/up,
# in-place RoPE, residual adds into bf16 buffers, logits in bf16)
# ---------------------------------------------------------------------------

def forward(params, cfg, ids, mask, P):
    """Logits [B, T, V] (float64 view of the buffer). params: fp32/f64 leaf tensors."""
    H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // NH
    B, T = ids.shape
    W = lambda n: P.weight(params[n])  # noqa: E731
    has_bias = "model.layers.0.self_attn.q_proj.bias" in params

    pos = (mask.cumsum(-1) - 1).clamp(min=0).to(P.dtype)
    # Hugging Face's RoPE: inv_freq and angles in fp32 (float64 in the exact model).
    inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=P.dtype) / hd)
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)) & mask.bool()[:, None, :]
    allowed = allowed | (~allowed.any(-1, keepdim=True) & torch.eye(T, dtype=torch.bool))
    allowed = allowed[:, None]

    x = P.act(W("model.embed_tokens.weight")[ids])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        n = P.act(mf.rms_norm(x, W(p + "input_layernorm.weight"), eps))
        wqkv = torch.cat([W(p + f"self_attn.{s}_proj.weight") for s in "qkv"])
        qkv = n @ wqkv.T
        if has_bias:  # added after the product is rounded (cuda/matmul.cu)
            qkv = P.act(qkv) + torch.cat([W(p + f"self_attn.{s}_proj.bias") for s in "qkv"])
        qkv = P.act(qkv)
        q, k, v = qkv.split([NH * hd, NKV * hd, NKV * hd], dim=-1)
        q = q.reshape(B, T, NH, hd).transpose(1, 2)
        k = k.reshape(B, T, NKV, hd).transpose(1, 2)
        v = v.reshape(B, T, NKV, hd).transpose(1, 2)
        q = P.act(q * cos + mf.rotate_half(q) * sin)
        k = P.act(k * cos + mf.rotate_half(k) * sin)
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = P.grad((q @ k.transpose(-1, -2)) * hd**-0.5)
        s = s.masked_fill(~allowed, float("-inf"))
        att = P.act(P.value(s.softmax(-1)) @ v)
        att = att.transpose(1, 2).reshape(B, T, NH * hd)
        h = P.act(P.act(att @ W(p + "self_attn.o_proj.weight").T) + x)
        n = P.act(mf.rms_norm(h, W(p + "post_attention_layernorm.weight"), eps))
        wgu = torch.cat([W(p + "mlp.gate_proj.weight"), W(p + "mlp.up_proj.weight")])
        gate, up = P.act(n @ wgu.T).chunk(2, dim=-1)
        a = P.act(torch.nn.functional.silu(gate) * up)
        x = P.act(P.act(a @ W(p + "mlp.down_proj.weight").T) + h)
    x = P.act(mf.rms_norm(x, W("model.norm.weight"), eps))
    head = "lm_head.weight" if "lm_head.weight" in params else "model.embed_tokens.weight"
    # The log-prob kernel reads the bf16 logits and works in fp32; float64 here differs
    # from fp32 by ~1e-7, nothing beside bf16.
    return P.act(x @ W(head).T).to(F64)


def leaves(params, dtype):
    return {n: t.detach().to(dtype).clone().requires_grad_(True) for n, t in params.items()}


def run_case(params, cfg, ids, mask, weights, P):
    """(logprobs, entropy, weighted loss, {name: grad}) of one precision."""
    x = leaves(params, P.dtype)
    lp, ent = mf.token_stats(forward(x, cfg, ids, mask, P), ids, mask)
    loss = -(weights * lp).sum()
    loss.backward()
    return lp.detach(), ent.detach(), loss.item(), {n: t.grad.to(F64) for n, t in x.items()}


def run_sft(params, cfg, case, P):
    """make_fixtures.run_sft with the model in P's precision and fp32 AdamW masters."""
    x = leaves(params, F32)
    opt = torch.optim.AdamW(list(x.values()), lr=mf.SFT["lr"],
                            betas=(mf.SFT["beta1"], mf.SFT["beta2"]), eps=mf.SFT["eps"],
                            weight_decay=mf.SFT["weight_decay"])
    ids, mask = case["input_ids"], case["attention_mask"]
    lm = case["loss_mask"].to(F64) * mf.valid_mask(mask).to(F64)
    losses, norms = [], []
    for step in range(mf.SFT["total_steps"]):
        for group in opt.param_groups:
            group["lr"] = mf.lr_at(step)
        opt.zero_grad()
        lp, _ = mf.token_stats(forward(x, cfg, ids, mask, P), ids, mask)
        loss = (lm * -lp).sum() / lm.sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(x.values()), mf.SFT["max_grad_norm"])
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms


# ---------------------------------------------------------------------------
# Random models: test/native/random-model.ts, reproduced bit for bit
# ---------------------------------------------------------------------------

M32 = np.uint64(0xFFFFFFFF)


class Rng:
    """random-model.ts's Rng: draw k = mulberry32 hash of seed + (k + 1) * 0x6d2b79f5."""

    def __init__(self, seed):
        self.seed, self.k = seed, 0

    def u32(self, n):
        k = np.arange(self.k + 1, self.k + 1 + n, dtype=np.uint64)
        self.k += n
        a = (np.uint64(self.seed) + k * np.uint64(0x6D2B79F5)) & M32
        t = ((a ^ (a >> np.uint64(15))) * (a | np.uint64(1))) & M32
        t ^= (t + (((t ^ (t >> np.uint64(7))) * (t | np.uint64(61))) & M32)) & M32
        return (t ^ (t >> np.uint64(14))) & M32

    def normal(self, n):
        u = (self.u32(12 * n).astype(np.float64) + 0.5) / 2.0**32
        return u.reshape(n, 12).sum(1) - 6.0  # exact: any summation order gives it


def random_config(m):
    cfg = {**mf.BASE_CONFIG, "vocab_size": m["vocab"], "hidden_size": m["hidden"],
           "intermediate_size": m["intermediate"], "num_hidden_layers": m["layers"],
           "num_attention_heads": m["heads"], "num_key_value_heads": m["kvHeads"],
           "tie_word_embeddings": m["tied"], "attention_bias": m["attentionBias"],
           "rope_theta": 10000.0}
    assert m["hidden"] == m["heads"] * m["headDim"]
    return cfg


def random_params(cfg, seed):
    """writeRandomModel's values (float32 -> float64, exact)."""
    rng, out = Rng(seed), {}
    for name, shape, kind in mf.param_specs(cfg):
        n = rng.normal(math.prod(shape))
        if kind == "norm":
            v = 1 + 0.1 * n
        elif kind == "bias":
            v = 0.15 * n
        else:
            v = (1.2 / math.sqrt(shape[1])) * n
        out[name] = torch.from_numpy(v.astype(np.float32).reshape(shape)).to(F64)
    return out


def random_batch(case, vocab):
    """writeRandomBatch's (input_ids, attention_mask, weights)."""
    T, rows = case["T"], case["rows"]
    B = len(rows)
    rng = Rng(case["seed"] + 1)
    mask = torch.tensor([[1 if r["left"] <= t < T - r["right"] else 0 for t in range(T)]
                         for r in rows], dtype=torch.int64)
    ids = torch.from_numpy((rng.u32(B * T) % np.uint64(vocab)).astype(np.int64))
    ids = ids.reshape(B, T) * mask
    w = torch.from_numpy(rng.normal(B * T).astype(np.float32)).to(F64).reshape(B, T)
    return ids, mask, torch.where(mf.valid_mask(mask), w, torch.zeros((), dtype=F64))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

def elem_err(a, ref):
    return ((a - ref).abs() / (1 + ref.abs())).max().item() if ref.numel() else 0.0


def l2_err(a, ref):
    scale = ref.norm().item()
    return (a - ref).norm().item() / scale if scale > 0 else 0.0


def grad_errs(got, ref):
    """{name: max|a - b| / max|ref|}"""
    out = {}
    for n in ref:
        scale = ref[n].abs().max().item()
        out[n] = (got[n] - ref[n]).abs().max().item() / scale if scale > 0 else 0.0
    return out


def errors(lp, ent, loss, grads, ref_lp, ref_ent, ref_loss, ref_grads, weights):
    """The test's error measures of one run against its float64 reference."""
    g = grad_errs(grads, ref_grads)
    return {
        "lp": elem_err(lp, ref_lp),
        "lp_l2": l2_err(lp, ref_lp),
        "ent": elem_err(ent, ref_ent),
        # The weighted loss sums terms of both signs, so its own size says little about
        # its rounding error; the sum of the terms' sizes does.
        "loss": abs(loss - ref_loss) / max((weights * ref_lp).abs().sum().item(), 1e-30),
        "grad": max(g.values()),
        "worst": max(g, key=g.get),
    }


def report(title, e):
    print(f"{title}\n  lp {e['lp']:.2e} (l2 {e['lp_l2']:.2e})  ent {e['ent']:.2e}  "
          f"loss {e['loss']:.2e}  grad {e['grad']:.2e} ({e['worst']})")


def check_exact(params, cfg, ids, mask):
    """This file's model in float64 must be make_fixtures.forward."""
    ref = mf.forward(params, cfg, ids, mask)
    got = forward(params, cfg, ids, mask, Exact)
    d = (got - ref).abs().max().item()
    assert d < 1e-9, d


MEASURES = ["lp", "lp_l2", "ent", "loss", "grad"]


def fixtures():
    worst = dict.fromkeys(MEASURES + ["sft_loss", "sft_norm"], 0.0)
    for name, (overrides, dtype, _, seed) in mf.MODELS.items():
        cfg = {**mf.BASE_CONFIG, **overrides}
        params = mf.init_params(cfg, dtype, seed)
        case, _ = mf.read_safetensors(os.path.join(mf.FIXTURES, f"{name}.case.safetensors"))
        ids, mask = case["input_ids"], case["attention_mask"]
        check_exact(params, cfg, ids, mask)
        weights = case["weights"].to(F64)
        got = run_case(params, cfg, ids, mask, weights, BF16)
        ref = (case["ref.logprobs"].to(F64), case["ref.entropy"].to(F64),
               case["ref.loss"].item(), {n: case["grad." + n].to(F64) for n in params})
        e = errors(*got, *ref, weights)
        report(f"fixture {name} (bf16 vs the stored float64 references)", e)
        losses, norms = run_sft(params, cfg, case, BF16)
        ref_l, ref_n = case["sft.loss"].tolist(), case["sft.grad_norm"].tolist()
        e["sft_loss"] = max(abs(a - b) for a, b in zip(losses, ref_l))
        e["sft_norm"] = max(abs(a - b) / b for a, b in zip(norms, ref_n))
        print(f"  sft: max |loss - ref| {e['sft_loss']:.2e}, "
              f"max |norm - ref| / ref {e['sft_norm']:.2e}")
        print("  sft loss      " + " ".join(f"{v:.4f}" for v in losses))
        print("  sft loss ref  " + " ".join(f"{v:.4f}" for v in ref_l))
        print("  sft norm      " + " ".join(f"{v:.4f}" for v in norms))
        print("  sft norm ref  " + " ".join(f"{v:.4f}" for v in ref_n))
        for k in worst:
            worst[k] = max(worst[k], e[k])
    return worst


def random_cases():
    with open(os.path.join(HERE, "cuda-cases.json")) as f:
        cases = json.load(f)
    worst = dict.fromkeys(MEASURES, 0.0)
    for case in cases:
        cfg = random_config(case["model"])
        params = random_params(cfg, case["seed"])
        ids, mask, weights = random_batch(case, cfg["vocab_size"])
        # make_fixtures.forward always adds q/k/v biases: zeros stand in for none.
        ref_params = dict(params)
        if not case["model"]["attentionBias"]:
            for n, shape, _ in mf.param_specs({**cfg, "attention_bias": True}):
                if n.endswith("_proj.bias"):
                    ref_params[n] = torch.zeros(shape, dtype=F64)
        check_exact(ref_params, cfg, ids, mask)
        ref = run_case(params, cfg, ids, mask, weights, Exact)
        got = run_case(params, cfg, ids, mask, weights, BF16)
        e = errors(*got, *ref, weights)
        report(f"random: {case['name']} (bf16 vs float64)", e)
        for k in worst:
            worst[k] = max(worst[k], e[k])
    return worst


def main():
    fx = fixtures()
    rnd = random_cases()
    print("\nlargest errors")
    print("  fixtures: " + "  ".join(f"{k} {v:.2e}" for k, v in fx.items()))
    print("  random:   " + "  ".join(f"{k} {v:.2e}" for k, v in rnd.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
