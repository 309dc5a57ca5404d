#!/usr/bin/env python3
"""The PyTorch side of `npm run bench:convert` (bench/convert/run.ts runs it; see there).

  torch_convert.py make DIR [--tp N] [--seed S]
  torch_convert.py convert IN_MEGATRON_DIR HF_CONFIG_JSON OUT_FILE

make     writes a seeded random bf16 model of Qwen2.5-0.5B's shape (vocab 151936, hidden 896,
         intermediate 4864, 24 layers, 14 heads, 2 kv heads, tied embeddings, qkv biases;
         494M parameters) as the two inputs of a Megatron -> HF conversion:
           DIR/hf/config.json, DIR/hf/tokenizer_config.json    the HF base folder
           DIR/megatron/latest_checkpointed_iteration.txt       "1"
           DIR/megatron/iter_0000001/mp_rank_TT/model_optim_rng.pt   (TP = N, PP = 1)
         each rank file being torch.save({"model": state_dict, "iteration": 1,
         "checkpoint_version": 3.0}) with megatron-core's Transformer-Engine parameter names.
         The layout (QKV fused per query group, fc1 = [gate; up] per TP slice, row- and
         column-parallel splits, _extra_state entries) is test/ckpt/make_fixtures.py's
         megatron_model, the one the converter's tests are built on. Prints
         {"params", "torch", "python", "seconds"} as JSON.
convert  the competitor: the conversion as the reference converters (Megatron-LM's and
         verl's Megatron -> HF mergers) do it in PyTorch: torch.load every rank file whole
         (map_location="cpu"), merge into HF names with torch.cat (embedding on dim 0, cut to
         vocab_size; linear_proj and linear_fc2 on dim 1; output_layer on dim 0 when untied),
         split the fused QKV per query group into q/k/v weight and bias, split each rank's
         fc1 into its gate and up halves and concatenate those across ranks, take the norms
         from rank 0, drop the _extra_state entries; then write one safetensors file in HF
         state-dict order with the fixtures' pure-Python writer, which works as
         safetensors.torch.save_file does (every tensor turned into one bytes object, then
         all written; the safetensors package is not installed here).
         Prints {"seconds", "load_s", "merge_s", "write_s", "tensors", "bytes"} as JSON;
         the times are its own, from after the imports.

Exit status 3 when torch cannot be imported.
"""

import argparse
import collections
import json
import os
import platform
import sys
import time

try:
    import torch
except ImportError:
    print("torch_convert.py: the Python module 'torch' is missing "
          "(Debian/Ubuntu: apt-get install -y python3-torch libopenblas0)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "test", "ckpt"))
# make_fixtures pins torch to one thread when imported; the competitor keeps torch's default.
_THREADS = torch.get_num_threads()
from make_fixtures import megatron_model, param_specs, write_json, write_safetensors  # noqa: E402

torch.set_num_threads(_THREADS)

ITERATION = 1
INIT_STD, NORM_STD = 0.02, 0.02

# Qwen2.5-0.5B's shape (its real config.json, less the tokenizer ids).
SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}


# ---------------------------------------------------------------------------
# make
# ---------------------------------------------------------------------------

def hf_config():
    return dict(sorted({
        **SHAPE,
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "model_type": "qwen2",
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_sliding_window": False,
    }.items()))


def make(args):
    t0 = time.perf_counter()
    c = {**SHAPE, "arch": "qwen2", "tied": True, "dtype": torch.bfloat16}
    torch.manual_seed(args.seed)
    hf = collections.OrderedDict()
    for name, shape, kind in param_specs(c):
        t = torch.randn(shape, dtype=torch.float32)
        t = 1.0 + NORM_STD * t if kind == "norm" else INIT_STD * t
        hf[name] = t.to(torch.bfloat16)
        del t
    params = sum(t.numel() for t in hf.values())

    hf_dir = os.path.join(args.dir, "hf")
    os.makedirs(hf_dir)
    write_json(os.path.join(hf_dir, "config.json"), hf_config())
    write_json(os.path.join(hf_dir, "tokenizer_config.json"), {
        "eos_token": "<|endoftext|>",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
    })

    root = os.path.join(args.dir, "megatron")
    os.makedirs(root)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    for t in range(args.tp):
        model = megatron_model(hf, c, args.tp, 1, t, 0, True)
        d = os.path.join(root, f"iter_{ITERATION:07d}", f"mp_rank_{t:02d}")
        os.makedirs(d)
        torch.save({"model": model, "iteration": ITERATION, "checkpoint_version": 3.0},
                   os.path.join(d, "model_optim_rng.pt"))
        del model
    print(json.dumps({
        "params": params,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seconds": time.perf_counter() - t0,
    }))


# ---------------------------------------------------------------------------
# convert (the competitor)
# ---------------------------------------------------------------------------

def convert(args):
    t0 = time.perf_counter()
    with open(args.config) as f:
        cfg = json.load(f)
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    G, L, V = cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or H // NH
    per_group = NH // G
    tied = cfg.get("tie_word_embeddings", False)

    with open(os.path.join(args.input, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    iter_dir = os.path.join(args.input, f"iter_{iteration:07d}")
    ranks = sorted(d for d in os.listdir(iter_dir) if d.startswith("mp_rank_"))
    if any(len(r) != len("mp_rank_00") for r in ranks):
        sys.exit(f"torch_convert.py: {iter_dir}: only pipeline-parallel size 1 is handled")
    sds = [torch.load(os.path.join(iter_dir, r, "model_optim_rng.pt"), map_location="cpu")["model"]
           for r in ranks]
    t1 = time.perf_counter()

    def cat(name, dim):
        return torch.cat([sd[name] for sd in sds], dim=dim)

    def first(*names):
        for name in names:
            if name in sds[0]:
                return sds[0][name]
        raise KeyError(names[0])

    # HF state-dict order (Qwen2ForCausalLM's module order).
    out = collections.OrderedDict()
    out["model.embed_tokens.weight"] = cat("embedding.word_embeddings.weight", 0)[:V]
    for i in range(L):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        a = src + "self_attention."
        for suffix in ("weight", "bias"):
            if a + "linear_qkv." + suffix not in sds[0]:
                continue
            qkv = cat(a + "linear_qkv." + suffix, 0)
            rest = qkv.shape[1:]
            qkv = qkv.view(G, per_group + 2, hd, *rest)
            out[dst + "self_attn.q_proj." + suffix] = qkv[:, :per_group].reshape(-1, *rest)
            out[dst + "self_attn.k_proj." + suffix] = qkv[:, per_group].reshape(-1, *rest)
            out[dst + "self_attn.v_proj." + suffix] = qkv[:, per_group + 1].reshape(-1, *rest)
        out[dst + "self_attn.o_proj.weight"] = cat(a + "linear_proj.weight", 1)
        halves = [sd[src + "mlp.linear_fc1.weight"].chunk(2, dim=0) for sd in sds]
        out[dst + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves], dim=0)
        out[dst + "mlp.up_proj.weight"] = torch.cat([u for _, u in halves], dim=0)
        out[dst + "mlp.down_proj.weight"] = cat(src + "mlp.linear_fc2.weight", 1)
        out[dst + "input_layernorm.weight"] = first(
            a + "linear_qkv.layer_norm_weight", src + "input_layernorm.weight")
        out[dst + "post_attention_layernorm.weight"] = first(
            src + "mlp.linear_fc1.layer_norm_weight", src + "pre_mlp_layernorm.weight")
    out["model.norm.weight"] = sds[0]["decoder.final_layernorm.weight"]
    if not tied:
        out["lm_head.weight"] = cat("output_layer.weight", 0)[:V]
    t2 = time.perf_counter()

    written = write_safetensors(args.out, list(out.items()), {"format": "pt"})
    t3 = time.perf_counter()
    print(json.dumps({
        "seconds": t3 - t0,
        "load_s": t1 - t0,
        "merge_s": t2 - t1,
        "write_s": t3 - t2,
        "tensors": len(out),
        "bytes": written,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)

    m = sub.add_parser("make")
    m.set_defaults(fn=make)
    m.add_argument("dir")
    m.add_argument("--tp", type=int, default=2)
    m.add_argument("--seed", type=int, default=0)

    c = sub.add_parser("convert")
    c.set_defaults(fn=convert)
    c.add_argument("input")
    c.add_argument("config")
    c.add_argument("out")

    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
