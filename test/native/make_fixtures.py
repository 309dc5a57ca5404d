"""Generate PyTorch reference fixtures for the native (C++) Qwen2 core.

Run from the repository root with Debian's PyTorch (no transformers, no
safetensors package and no network needed; a current PyTorch writes the same bytes):

    /usr/bin/python3 test/native/make_fixtures.py [MODEL ...]

It (re)writes, under test/native/fixtures/ (only the named models when given):

  untied/config.json                          tiny Qwen2, 2 layers, untied lm_head
  untied/model.safetensors                    its weights, F32, one file
  tied/config.json                            tiny Qwen2, 3 layers, tied embeddings
  tied/model-0000{1,2}-of-00002.safetensors   its weights, BF16, two shards
  tied/model.safetensors.index.json           shard index (no lm_head.weight)
  untied-tf5/config.json                      tiny Qwen2, 2 layers, untied, rope_theta 1e6,
                                              in transformers 5's format: rope_parameters
                                              {rope_theta, rope_type} and dtype instead of
                                              rope_theta and torch_dtype, layer_types
  untied-tf5/model.safetensors                its weights, F32, one file
  <model>.case.safetensors
      one test case per model: a padded batch (input_ids, attention_mask,
      weights, loss_mask), reference per-token logprobs / entropy, the
      weighted-objective loss and its gradient for every parameter
      ("grad.<hf name>"), and a 10-step AdamW SFT trajectory (sft.loss,
      sft.grad_norm, sft.lr) with the hyperparameters in __metadata__["sft"].

The model is written from the Qwen2 architecture description (RMSNorm, GQA
attention with q/k/v biases, rotate-half RoPE, SwiGLU MLP); everything is
computed in float64 from the weights exactly as stored on disk (the BF16
model's weights are rounded to BF16 first).

Definitions shared with the native code (b = row, t = position):
  valid[b,t]    = t >= 1 and mask[b,t] == 1 and mask[b,t-1] == 1
  logprobs[b,t] = log_softmax(logits[b,t-1])[input_ids[b,t]] if valid else 0
  entropy[b,t]  = entropy(softmax(logits[b,t-1]))            if valid else 0
  weighted loss = -sum(weights * logprobs)        (weights are 0 where not valid)
  SFT loss      = sum(lm * -logprobs) / sum(lm),  lm = loss_mask * valid

check_transformers.py (beside this file) checks these files against transformers'
own Qwen2ForCausalLM where transformers is installed, and that transformers 5
writes the untied-tf5 config the same way.

The script then checks its own output (reload with the reader below, an
independent loop-based forward, central finite differences of the gradient,
padding invariance) and fails loudly if any check does not hold. Output is
deterministic: rerunning gives byte-identical files.
"""

import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch

torch.set_num_threads(1)  # fixed reduction order -> byte-identical reruns
F64 = torch.float64

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

BASE_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 128,
    "hidden_act": "silu",
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
}

MODELS = {
    # name: (config overrides, on-disk dtype, number of weight shards, init seed)
    "untied": ({}, "F32", 1, 1234),
    "tied": (
        {
            "num_hidden_layers": 3,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
            "torch_dtype": "bfloat16",
        },
        "BF16",
        2,
        5678,
    ),
    "untied-tf5": ({"rope_theta": 1000000.0}, "F32", 1, 2468),
}

# Models whose config.json is written as transformers 5 writes it (see disk_config).
TF5_FORMAT = {"untied-tf5"}

# Batch layout of every test case: (number of real tokens, padding side).
BATCH, SEQ = 4, 16
ROWS = [(16, None), (11, "right"), (9, "left"), (13, "left")]

# Random init: normal(0, INIT_STD) for matrices, embeddings and biases,
# 1 + normal(0, NORM_STD) for RMSNorm weights (so they are not all ones).
INIT_STD, NORM_STD = 0.15, 0.1

SFT = {
    "lr": 0.005,
    "warmup_steps": 2,
    "total_steps": 10,
    "schedule": "cosine",
    "min_lr_ratio": 0.1,
    "weight_decay": 0.01,
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "max_grad_norm": 1.0,
}


# ---------------------------------------------------------------------------
# safetensors I/O (format: u64 LE header length, JSON header, raw LE data)
# ---------------------------------------------------------------------------

def tensor_bytes(dtype, t):
    """Raw little-endian row-major bytes of `t` stored as safetensors `dtype`."""
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "I64":
        return t.to(torch.int64).numpy().astype("<i8").tobytes()
    if dtype == "BF16":
        # torch rounds to nearest-even; reinterpret the 16-bit pattern.
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, tensor), written in that order."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, t in tensors:
        data = tensor_bytes(dtype, t)
        header[name] = {
            "dtype": dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in blobs:
            f.write(data)
    return offset  # number of tensor data bytes


def read_safetensors(path):
    """Returns ({name: tensor}, metadata). F32/BF16 -> float32, I64 -> int64."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", None)
    data = raw[8 + n :]
    out, expect = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        assert begin == expect, f"{path}: hole or overlap before {name}"
        expect = end
        buf = data[begin:end]
        if info["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        elif info["dtype"] == "I64":
            arr = np.frombuffer(buf, dtype="<i8").astype(np.int64)
        elif info["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            raise ValueError(info["dtype"])
        assert arr.size == math.prod(info["shape"]), name
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    assert expect == len(data), f"{path}: trailing bytes"
    return out, metadata


def to_json(obj, indent=0):
    """JSON text as both HF (2-space indent, sorted keys) and the repo's biome
    formatter write it: objects one key per line, scalar arrays on one line,
    exponents without zero padding (1e-6, not Python's 1e-06)."""
    pad = "  " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}  {json.dumps(k)}: {to_json(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(to_json(v, indent + 1) for v in obj) + "]"
    if isinstance(obj, float):
        return re.sub(r"e([+-]?)0*(\d)", r"e\1\2", repr(obj)).replace("e+", "e")
    return json.dumps(obj)


def write_json(path, obj):
    with open(path, "w") as f:
        f.write(to_json(obj) + "\n")


def disk_config(name, cfg):
    """config.json as written for `name`. The models here are described in the
    transformers 4.x keys (top-level rope_theta, torch_dtype); TF5_FORMAT models get
    the keys Qwen2Config.save_pretrained writes in transformers 5 instead."""
    if name not in TF5_FORMAT:
        return dict(cfg)
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "torch_dtype")}
    out.update({
        "dtype": cfg["torch_dtype"],
        "rope_parameters": {"rope_theta": cfg["rope_theta"], "rope_type": "default"},
        "layer_types": ["full_attention"] * cfg["num_hidden_layers"],
        "sliding_window": None,
        "max_window_layers": 28,
        "initializer_range": 0.02,
        "use_cache": True,
        "pad_token_id": None,
        "transformers_version": "5.18.0",
    })
    return out


def rope_theta_on_disk(disk):
    """The RoPE base a config.json gives, in either format (as transformers 5 reads it)."""
    rope = disk.get("rope_scaling") or disk.get("rope_parameters") or {}
    assert rope.get("rope_type", rope.get("type", "default")) == "default", rope
    return rope.get("rope_theta", disk.get("rope_theta", 10000.0))


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

def param_specs(cfg):
    """(name, shape, kind) for every parameter, in HF checkpoint order. q/k/v biases as
    Qwen2 has them, unless the config says `attention_bias: false` (Llama)."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // NH
    bias = cfg.get("attention_bias", True)
    specs = [("model.embed_tokens.weight", (V, H), "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (H,), "norm"))
        for proj, rows in (("q", NH * hd), ("k", NKV * hd), ("v", NKV * hd)):
            specs.append((p + f"self_attn.{proj}_proj.weight", (rows, H), "matrix"))
            if bias:
                specs.append((p + f"self_attn.{proj}_proj.bias", (rows,), "bias"))
        specs += [
            (p + "self_attn.o_proj.weight", (H, NH * hd), "matrix"),
            (p + "post_attention_layernorm.weight", (H,), "norm"),
            (p + "mlp.gate_proj.weight", (I, H), "matrix"),
            (p + "mlp.up_proj.weight", (I, H), "matrix"),
            (p + "mlp.down_proj.weight", (H, I), "matrix"),
        ]
    specs.append(("model.norm.weight", (H,), "norm"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (V, H), "matrix"))
    return specs


def init_params(cfg, dtype, seed):
    """Random float64 parameters holding exactly the values stored on disk."""
    torch.manual_seed(seed)
    params = {}
    for name, shape, kind in param_specs(cfg):
        t = torch.randn(shape, dtype=torch.float32)
        t = 1.0 + NORM_STD * t if kind == "norm" else INIT_STD * t
        if dtype == "BF16":
            t = t.to(torch.bfloat16)
        params[name] = t.to(F64)
    return params


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(params, cfg, input_ids, attention_mask, linear=None):
    """Logits [B,T,V] in float64. params: {hf name: float64 tensor}. linear(module, x):
    the projection of x by the linear layer `module` (its HF name without ".weight"),
    x @ weight.T without a bias unless given (make_lora_fixtures.py adds adapters)."""
    if linear is None:
        linear = lambda module, x: x @ params[module + ".weight"].T  # noqa: E731
    H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // NH
    B, T = input_ids.shape
    mask = attention_mask.bool()

    # RoPE tables from per-row positions (left padding shifts them).
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0).to(F64)  # [B,T]
    inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=F64) / hd)
    freqs = pos[..., None] * inv_freq  # [B,T,hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [B,1,T,hd]

    # allowed[b,i,j]: causal and key j is a real token; rows that would allow
    # nothing (queries in the left padding) attend to themselves only.
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)) & mask[:, None, :]
    allowed = allowed | (~allowed.any(-1, keepdim=True) & torch.eye(T, dtype=torch.bool))
    allowed = allowed[:, None]  # [B,1,T,T]

    x = params["model.embed_tokens.weight"][input_ids]
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: params[f"model.layers.{i}.{n}"]  # noqa: E731
        lin = lambda m, x: linear(f"model.layers.{i}.{m}", x)  # noqa: E731
        n = rms_norm(x, p("input_layernorm.weight"), eps)
        q = lin("self_attn.q_proj", n) + p("self_attn.q_proj.bias")
        k = lin("self_attn.k_proj", n) + p("self_attn.k_proj.bias")
        v = lin("self_attn.v_proj", n) + p("self_attn.v_proj.bias")
        q = q.view(B, T, NH, hd).transpose(1, 2)  # [B,NH,T,hd]
        k = k.view(B, T, NKV, hd).transpose(1, 2)  # [B,NKV,T,hd]
        v = v.view(B, T, NKV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h reads kv head h // (NH / NKV).
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        scores = (q @ k.transpose(-1, -2)) * hd**-0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = scores.softmax(-1) @ v  # [B,NH,T,hd]
        attn = attn.transpose(1, 2).reshape(B, T, NH * hd)
        h = x + lin("self_attn.o_proj", attn)
        n = rms_norm(h, p("post_attention_layernorm.weight"), eps)
        gate = torch.nn.functional.silu(lin("mlp.gate_proj", n))
        x = h + lin("mlp.down_proj", gate * lin("mlp.up_proj", n))
    x = rms_norm(x, params["model.norm.weight"], eps)
    lm_head = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    return x @ lm_head.T


def valid_mask(attention_mask):
    valid = torch.zeros_like(attention_mask, dtype=torch.bool)
    valid[:, 1:] = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return valid


def token_stats(logits, input_ids, attention_mask):
    """(logprobs, entropy), both [B,T], 0 where not valid."""
    valid = valid_mask(attention_mask)
    logp = logits[:, :-1].log_softmax(-1)  # predicts position t from t-1
    lp = logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros(input_ids.shape[0], 1, dtype=F64)
    lp = torch.cat((zero, lp), 1).masked_fill(~valid, 0.0)
    ent = torch.cat((zero, ent), 1).masked_fill(~valid, 0.0)
    return lp, ent


def weighted_loss(params, cfg, case):
    logits = forward(params, cfg, case["input_ids"], case["attention_mask"])
    lp, _ = token_stats(logits, case["input_ids"], case["attention_mask"])
    return -(case["weights"] * lp).sum()


def sft_loss(params, cfg, case):
    logits = forward(params, cfg, case["input_ids"], case["attention_mask"])
    lp, _ = token_stats(logits, case["input_ids"], case["attention_mask"])
    lm = case["loss_mask"].to(F64) * valid_mask(case["attention_mask"]).to(F64)
    return (lm * -lp).sum() / lm.sum()


def lr_at(step):
    """Cosine schedule with linear warmup, for 0-based optimizer step `step`."""
    peak, warmup, total = SFT["lr"], SFT["warmup_steps"], SFT["total_steps"]
    if step < warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * max(0.0, SFT["min_lr_ratio"] + (1.0 - SFT["min_lr_ratio"]) * cosine)


def run_sft(params, cfg, case):
    """SFT steps on the whole batch; returns (loss, pre-clip grad norm, lr) lists."""
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    opt = torch.optim.AdamW(
        list(leaves.values()),
        lr=SFT["lr"],
        betas=(SFT["beta1"], SFT["beta2"]),
        eps=SFT["eps"],
        weight_decay=SFT["weight_decay"],
    )
    losses, norms, lrs = [], [], []
    for step in range(SFT["total_steps"]):
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = sft_loss(leaves, cfg, case)  # before this step's update
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(leaves.values()), SFT["max_grad_norm"])
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    return losses, norms, lrs


# ---------------------------------------------------------------------------
# Test case
# ---------------------------------------------------------------------------

def make_case(cfg, seed):
    """Padded batch: input_ids, attention_mask, weights, loss_mask."""
    torch.manual_seed(seed)
    ids = torch.randint(3, cfg["vocab_size"], (BATCH, SEQ), dtype=torch.int64)
    mask = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    loss_mask = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    for b, (n, side) in enumerate(ROWS):
        start = SEQ - n if side == "left" else 0
        mask[b, start : start + n] = 1
        loss_mask[b, start + n // 2 : start + n] = 1  # second half = "response"
    ids = ids * mask  # padded positions hold token 0
    valid = valid_mask(mask)
    loss_mask = loss_mask * valid
    assert (loss_mask.sum(1) > 0).all()
    weights = torch.where(valid, torch.randn(BATCH, SEQ, dtype=torch.float32), 0.0)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        # float64 copy of exactly the stored float32 values
        "weights": weights.to(F64),
    }


# ---------------------------------------------------------------------------
# Self checks
# ---------------------------------------------------------------------------

def naive_logprobs(params, cfg, ids):
    """Independent, loop-based forward for ONE unpadded sequence (list of ids).

    Written differently on purpose (explicit position/head loops, RoPE as pair
    rotations of (x[j], x[j + hd/2])); returns log-probs of tokens 1..n-1.
    """
    H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, group = H // NH, NH // NKV
    W = {k: v.to(F64) for k, v in params.items()}

    def norm(x, w):
        return w * x / math.sqrt(float((x * x).mean()) + eps)

    def rope(x, pos):
        out = x.clone()
        for j in range(hd // 2):
            ang = pos / cfg["rope_theta"] ** (2 * j / hd)
            a, b = x[j], x[j + hd // 2]
            out[j] = a * math.cos(ang) - b * math.sin(ang)
            out[j + hd // 2] = b * math.cos(ang) + a * math.sin(ang)
        return out

    xs = [W["model.embed_tokens.weight"][t] for t in ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qs, ks, vs = [], [], []
        for pos, x in enumerate(xs):
            n = norm(x, W[p + "input_layernorm.weight"])
            q = W[p + "self_attn.q_proj.weight"] @ n + W[p + "self_attn.q_proj.bias"]
            k = W[p + "self_attn.k_proj.weight"] @ n + W[p + "self_attn.k_proj.bias"]
            v = W[p + "self_attn.v_proj.weight"] @ n + W[p + "self_attn.v_proj.bias"]
            qs.append([rope(q[h * hd : (h + 1) * hd], pos) for h in range(NH)])
            ks.append([rope(k[h * hd : (h + 1) * hd], pos) for h in range(NKV)])
            vs.append([v[h * hd : (h + 1) * hd] for h in range(NKV)])
        new = []
        for t, x in enumerate(xs):
            heads = []
            for h in range(NH):
                kv = h // group
                s = torch.stack([qs[t][h].dot(ks[j][kv]) / math.sqrt(hd) for j in range(t + 1)])
                a = torch.exp(s - s.max())
                a = a / a.sum()
                heads.append(sum(a[j] * vs[j][kv] for j in range(t + 1)))
            h1 = x + W[p + "self_attn.o_proj.weight"] @ torch.cat(heads)
            n = norm(h1, W[p + "post_attention_layernorm.weight"])
            g = W[p + "mlp.gate_proj.weight"] @ n
            u = W[p + "mlp.up_proj.weight"] @ n
            new.append(h1 + W[p + "mlp.down_proj.weight"] @ (g / (1 + torch.exp(-g)) * u))
        xs = new
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    out = []
    for t in range(1, len(ids)):
        logits = head @ norm(xs[t - 1], W["model.norm.weight"])
        m = logits.max()
        lse = m + torch.log(torch.exp(logits - m).sum())
        out.append(float(logits[ids[t]] - lse))
    return out


def self_check(name, cfg, params, grads, case, lp):
    """Reload the written files and verify them; raises AssertionError on failure."""
    mdir = os.path.join(FIXTURES, name)
    report = []

    # 1. Reload config, weights and case with our own reader; bit-exact round trip.
    with open(os.path.join(mdir, "config.json")) as f:
        disk = json.load(f)
    assert rope_theta_on_disk(disk) == cfg["rope_theta"], "config.json's rope_theta"
    assert ("rope_theta" in disk) == (name not in TF5_FORMAT), "config format"
    if cfg["tie_word_embeddings"]:
        with open(os.path.join(mdir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        stored, total = {}, 0
        for shard in sorted(set(index["weight_map"].values())):
            t, _ = read_safetensors(os.path.join(mdir, shard))
            assert all(index["weight_map"][k] == shard for k in t)
            total += sum(v.numel() * 2 for v in t.values())  # BF16: 2 bytes each
            stored.update(t)
        assert total == index["metadata"]["total_size"]
        assert set(index["weight_map"]) == set(stored)
    else:
        stored, _ = read_safetensors(os.path.join(mdir, "model.safetensors"))
    assert set(stored) == set(params), "parameter names differ"
    assert "lm_head.weight" not in stored or not cfg["tie_word_embeddings"]
    for k, v in stored.items():
        assert torch.equal(v.to(F64), params[k]), f"weight {k} differs after reload"
    got, meta = read_safetensors(os.path.join(FIXTURES, f"{name}.case.safetensors"))
    assert json.loads(meta["sft"]) == SFT
    for k in ("input_ids", "attention_mask", "loss_mask"):
        assert torch.equal(got[k], case[k]), k
    assert torch.equal(got["weights"].to(F64), case["weights"])
    for k, g in grads.items():
        assert torch.equal(got["grad." + k], g.to(torch.float32)), k
    report.append("reload: weights bit-exact, case tensors intact")

    # 2. Logprobs/entropy recomputed from the reloaded files match the stored
    #    float32 references; and an independent loop-based forward agrees.
    ids, mask = got["input_ids"], got["attention_mask"]
    lp2, ent2 = token_stats(forward({k: v.to(F64) for k, v in stored.items()}, cfg, ids, mask),
                            ids, mask)
    d_lp = (lp2 - got["ref.logprobs"].to(F64)).abs().max().item()
    d_ent = (ent2 - got["ref.entropy"].to(F64)).abs().max().item()
    assert d_lp < 1e-5 and d_ent < 1e-5, (d_lp, d_ent)
    d_naive = 0.0
    for b in range(BATCH):
        real = mask[b].nonzero()[:, 0]
        ref = naive_logprobs(stored, cfg, ids[b, real].tolist())
        for j, t in enumerate(real[1:].tolist()):
            d_naive = max(d_naive, abs(ref[j] - lp[b, t].item()))
    assert d_naive < 1e-10, d_naive
    report.append(
        f"logprobs vs stored F32: max|d|={d_lp:.2e}, entropy max|d|={d_ent:.2e}; "
        f"vs independent loop forward (f64): max|d|={d_naive:.2e}"
    )

    # 3. Padding invariance: each row alone, unpadded, gives the same logprobs.
    d_pad = 0.0
    for b in range(BATCH):
        real = mask[b].nonzero()[:, 0]
        row = {
            "input_ids": ids[b, real][None],
            "attention_mask": torch.ones(1, len(real), dtype=torch.int64),
        }
        lp_row, _ = token_stats(forward(params, cfg, row["input_ids"], row["attention_mask"]),
                                row["input_ids"], row["attention_mask"])
        d_pad = max(d_pad, (lp_row[0] - lp[b, real]).abs().max().item())
    assert d_pad < 1e-12, d_pad
    report.append(f"padding invariance (rows alone vs batched): max|d|={d_pad:.2e}")

    # 4. Central finite differences of the weighted loss for a few entries.
    gen = torch.Generator().manual_seed(99)
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.bias", "model.layers.0.self_attn.v_proj.weight",
             "model.layers.1.input_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
             "model.layers.1.self_attn.o_proj.weight", "model.norm.weight"]
    names += ["lm_head.weight"] if "lm_head.weight" in params else []
    worst, h = 0.0, 1e-5
    for pname in names:
        flat = params[pname].view(-1)
        if pname == "model.embed_tokens.weight":
            # pick an entry of a token that occurs in the batch (nonzero grad)
            row = ids[mask.bool()][0].item()
            picks = [row * cfg["hidden_size"] + 5, row * cfg["hidden_size"] + 17]
        else:
            picks = torch.randint(0, flat.numel(), (2,), generator=gen).tolist()
        for idx in picks:
            saved = flat[idx].item()
            flat[idx] = saved + h
            up = weighted_loss(params, cfg, case).item()
            flat[idx] = saved - h
            down = weighted_loss(params, cfg, case).item()
            flat[idx] = saved
            fd = (up - down) / (2 * h)
            an = grads[pname].view(-1)[idx].item()
            rel = abs(fd - an) / max(abs(fd), abs(an), 1e-6)
            worst = max(worst, rel)
    assert worst < 1e-6, worst
    report.append(f"finite differences ({2 * len(names)} entries, h={h}): max rel err={worst:.2e}")
    return report


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def write_model(name, cfg, dtype, shards, params):
    mdir = os.path.join(FIXTURES, name)
    os.makedirs(mdir, exist_ok=True)
    write_json(os.path.join(mdir, "config.json"), disk_config(name, cfg))
    tensors = [(n, dtype, params[n]) for n, _, _ in param_specs(cfg)]
    meta = {"format": "pt"}
    if shards == 1:
        write_safetensors(os.path.join(mdir, "model.safetensors"), tensors, meta)
        return
    # Split in checkpoint order at roughly half of the data bytes.
    sizes = [len(tensor_bytes(dtype, t)) for _, _, t in tensors]
    half, acc, cut = sum(sizes) / 2, 0, 0
    while acc + sizes[cut] <= half:
        acc += sizes[cut]
        cut += 1
    parts = [tensors[:cut], tensors[cut:]]
    weight_map, total = {}, 0
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        total += write_safetensors(os.path.join(mdir, fname), part, meta)
        weight_map.update({n: fname for n, _, _ in part})
    write_json(
        os.path.join(mdir, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def build(name):
    overrides, dtype, shards, seed = MODELS[name]
    cfg = {**BASE_CONFIG, **overrides}
    params = init_params(cfg, dtype, seed)
    write_model(name, cfg, dtype, shards, params)

    case = make_case(cfg, seed + 1)
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    logits = forward(leaves, cfg, case["input_ids"], case["attention_mask"])
    lp, ent = token_stats(logits, case["input_ids"], case["attention_mask"])
    loss = -(case["weights"] * lp).sum()
    loss.backward()
    grads = {n: t.grad.detach() for n, t in leaves.items()}
    lp, ent = lp.detach(), ent.detach()

    sft_losses, sft_norms, sft_lrs = run_sft(params, cfg, case)

    tensors = [
        ("input_ids", "I64", case["input_ids"]),
        ("attention_mask", "I64", case["attention_mask"]),
        ("weights", "F32", case["weights"]),
        ("loss_mask", "I64", case["loss_mask"]),
        ("ref.logprobs", "F32", lp),
        ("ref.entropy", "F32", ent),
        ("ref.loss", "F32", loss.detach().reshape(1)),
    ]
    tensors += [("grad." + n, "F32", grads[n]) for n, _, _ in param_specs(cfg)]
    tensors += [
        ("sft.loss", "F32", torch.tensor(sft_losses, dtype=F64)),
        ("sft.grad_norm", "F32", torch.tensor(sft_norms, dtype=F64)),
        ("sft.lr", "F32", torch.tensor(sft_lrs, dtype=F64)),
    ]
    write_safetensors(
        os.path.join(FIXTURES, f"{name}.case.safetensors"),
        tensors,
        {"sft": json.dumps(SFT, separators=(",", ":"))},
    )

    print(f"== {name}: weighted loss {loss.item():.9f}")
    print("   sft.loss      " + " ".join(f"{v:.6f}" for v in sft_losses))
    print("   sft.grad_norm " + " ".join(f"{v:.6f}" for v in sft_norms))
    print("   sft.lr        " + " ".join(f"{v:.6g}" for v in sft_lrs))
    for line in self_check(name, cfg, params, grads, case, lp):
        print("   check ok: " + line)


def main(names):
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown model(s) {unknown}; known: {list(MODELS)}", file=sys.stderr)
        return 2
    os.makedirs(FIXTURES, exist_ok=True)
    for name in names or MODELS:
        build(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
