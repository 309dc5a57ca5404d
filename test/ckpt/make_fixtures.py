"""Generate checkpoint-conversion fixtures (Megatron-LM and verl FSDP -> Hugging Face).

Run from the repository root with Debian's PyTorch (torch 1.13 CPU + numpy; no
transformers, no safetensors package, no network):

    /usr/bin/python3 test/ckpt/make_fixtures.py

The script wipes test/ckpt/fixtures/ and writes, deterministically (fixed seeds,
so a rerun gives byte-identical files):

hf/<model>/            three tiny Hugging Face model folders, the "truth":
    untied   qwen2, vocab 32, untied lm_head, F32, one model.safetensors
    tied     qwen2, vocab 32, tied embeddings, BF16, two shards + index, no lm_head
    llama    llama, vocab 30, untied, no attention biases, F32, one file
  each with config.json, generation_config.json and small tokenizer files.
  Dims: hidden 16, 4 query heads and 2 kv heads of size 4, intermediate 24, 4 layers.

megatron/<case>/       Megatron-LM legacy "torch" checkpoints made from those weights:
    latest_checkpointed_iteration.txt                        "300"
    iter_0000300/mp_rank_TT/model_optim_rng.pt               (PP = 1)
    iter_0000300/mp_rank_TT_PPP/model_optim_rng.pt           (PP > 1)
  Each file is the dict save_checkpoint writes (args Namespace, checkpoint_version
  3.0, iteration, model, optimizer, opt_param_scheduler, rng_state with Python /
  numpy / torch RNG states, num_floating_point_operations_so_far). args holds two
  Megatron enums: attention_backend = AttnBackend.auto, pickled the Python >= 3.11
  way (builtins.getattr(AttnBackend, "auto")), and model_type =
  ModelType.encoder_or_decoder, pickled the Python <= 3.10 way (ModelType(1)).
  "model" is the local
  megatron-core GPT state dict of that (tp, pp) rank:
    embedding.word_embeddings.weight        PP stage 0; vocab padded with zero rows
                                            to a multiple of TP, rows split over TP
    decoder.layers.{i}.*                    i is the stage-local layer index;
                                            stage p holds global layers p*L/PP ...
      self_attention.linear_qkv.weight      fused QKV: per kv group g the group's
                                            query heads, then its k head, then its
                                            v head ([G, q/g + 2, hd, H]); TP rank t
                                            holds groups t*G/TP .. (t+1)*G/TP-1
      self_attention.linear_qkv.bias        same layout (qwen2 only)
      self_attention.linear_proj.weight     o_proj split on dim 1
      mlp.linear_fc1.weight                 [gate rows of rank t ; up rows of rank t]
      mlp.linear_fc2.weight                 down_proj split on dim 1
      TE naming:    self_attention.linear_qkv.layer_norm_weight (input_layernorm),
                    mlp.linear_fc1.layer_norm_weight (post_attention_layernorm),
                    and *._extra_state entries (None / BytesIO / empty uint8 tensor)
      plain naming: input_layernorm.weight, pre_mlp_layernorm.weight
    decoder.final_layernorm.weight          last stage, replicated over TP
    output_layer.weight                     last stage: lm_head rows split over TP
                                            when untied; when tied and PP > 1 a copy
                                            of the (padded, split) embedding
  Cases: tp1-pp1-te-untied, tp2-pp1-te-untied, tp1-pp2-plain-tied,
  tp2-pp2-te-tied, tp2-pp2-plain-untied (all params of a file are views of one
  flat buffer like Megatron's DDP param buffer; one is a transposed,
  non-contiguous view), tp2-pp1-te-llama (vocab 30 padded to 32).

fsdp/<case>/           verl FSDP actor checkpoints:
    latest_checkpointed_iteration.txt, global_step_300/data.pt,
    global_step_300/actor/{model,optim,extra_state}_world_size_W_rank_R.pt,
    global_step_300/actor/fsdp_config.json, global_step_300/actor/huggingface/
  ws1-tied            W=1, plain tensors keyed by HF names; embed_tokens and
                      lm_head are the same tensor object (one shared storage)
  ws2-dtensor-untied  W=2, parameters pickled exactly as torch>=2 pickles a
                      DTensor (_rebuild_from_type_v2 / _rebuild_wrapper_subclass /
                      DTensorSpec / DeviceMesh / Shard / Replicate / TensorMeta);
                      local shard = torch.chunk(full, 2, dim)[rank]; Shard(0)
                      everywhere except layers.0.mlp.down_proj (Shard(1)) and
                      model.norm (Replicate()); the layer norms are plain full
                      tensors on both ranks (take one, do not concatenate).

cast/                  dtype-cast references (safetensors): hf/untied -> bf16 and
                       fp16, hf/tied -> fp32, and edge.safetensors (x in F32 with
                       edge values, x.bf16, x.fp16 and their F32 upcasts).

torch 1.13 has no DTensor and no Megatron; the globals those pickles reference
are registered as stand-in modules/classes under the exact dotted names so that
torch.save writes the same pickle opcodes a real run would. The script then
re-reads everything with its own zip reader and a restricted unpickler (which
maps those names to local stubs; this Debian torch build ignores torch.load's
pickle_module argument), merges the shards with an independent implementation
and asserts the results are bit-identical to the HF safetensors files, and checks
the casts against independent numpy rounding; it fails loudly otherwise.
"""

import argparse
import collections
import copyreg
import dataclasses
import enum
import hashlib
import importlib.util
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import struct
import subprocess
import sys
import types
import typing
import zipfile

import numpy as np
import torch

torch.set_num_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")
# The native fixtures' generator, loaded by path: both scripts are named make_fixtures.
_spec = importlib.util.spec_from_file_location(
    "native_make_fixtures", os.path.join(HERE, "..", "native", "make_fixtures.py"))
_native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_native)
native_param_specs = _native.param_specs
ITER = 300
INIT_STD, NORM_STD = 0.15, 0.1

COMMON = {
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "num_hidden_layers": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
}

# name: (arch, vocab, tied, torch dtype, shards, seed)
MODELS = {
    "untied": ("qwen2", 32, False, torch.float32, 1, 1001),
    "tied": ("qwen2", 32, True, torch.bfloat16, 2, 2002),
    "llama": ("llama", 30, False, torch.float32, 1, 3003),
}

# name: (base model, TP, PP, TE naming, DDP flat buffer)
MEGATRON_CASES = {
    "tp1-pp1-te-untied": ("untied", 1, 1, True, False),
    "tp2-pp1-te-untied": ("untied", 2, 1, True, False),
    "tp1-pp2-plain-tied": ("tied", 1, 2, False, False),
    "tp2-pp2-te-tied": ("tied", 2, 2, True, False),
    "tp2-pp2-plain-untied": ("untied", 2, 2, False, True),
    "tp2-pp1-te-llama": ("llama", 2, 1, True, False),
    "tp2-pp1-te-tied": ("tied", 2, 1, True, False),
}
MAKE_VOCAB_DIVISIBLE_BY = 16  # Megatron pads vocab to a multiple of this * TP

FSDP_CASES = {
    "ws1-tied": ("tied", 1),
    "ws2-dtensor-untied": ("untied", 2),
}

TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
]


# ---------------------------------------------------------------------------
# JSON in the layout the repo's biome formatter accepts (2-space indent,
# objects one key per line, short scalar arrays on one line)
# ---------------------------------------------------------------------------

def _scalar(v):
    if isinstance(v, bool) or v is None or isinstance(v, int):
        return json.dumps(v)
    if isinstance(v, float):
        return re.sub(r"e([+-]?)0*(\d)", r"e\1\2", repr(v)).replace("e+", "e")
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(type(v))


def to_json(obj, indent=0, used=0):
    """`used`: columns already taken on the current line (for the width check)."""
    pad = "  " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        lines = []
        for k, v in obj.items():
            head = pad + "  " + json.dumps(k, ensure_ascii=False) + ": "
            lines.append(head + to_json(v, indent + 1, len(head)))
        return "{\n" + ",\n".join(lines) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            one = "[" + ", ".join(_scalar(v) for v in obj) + "]"
            if used + len(one) + 1 <= 100:
                return one
        items = [pad + "  " + to_json(v, indent + 1, len(pad) + 2) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return _scalar(obj)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(obj) + "\n")


def write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ---------------------------------------------------------------------------
# safetensors (u64 LE header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------

ST_NAME = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
ST_DTYPE = {v: k for k, v in ST_NAME.items()}


def raw_bytes(t):
    """The tensor's bytes as safetensors stores them (one copy; little-endian hosts only)."""
    assert sys.byteorder == "little"
    t = t.detach().contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32).numpy().tobytes()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    raise ValueError(t.dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor) in file order; dtype taken from the tensor."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors:
        data = raw_bytes(t)
        header[name] = {
            "dtype": ST_NAME[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in blobs:
            f.write(data)
    return offset


def read_safetensors(path):
    """{name: tensor in its stored dtype}, in file order."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    out, expect = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        assert begin == expect, f"{path}: hole before {name}"
        expect = end
        dtype = ST_DTYPE[info["dtype"]]
        npd = "<i4" if dtype == torch.float32 else "<i2"
        bits = np.frombuffer(data[begin:end], dtype=npd).astype(npd[1:])
        t = torch.from_numpy(bits.copy()).view(dtype)
        assert t.numel() == math.prod(info["shape"]), name
        out[name] = t.reshape(info["shape"])
    assert expect == len(data), f"{path}: trailing bytes"
    return out


def read_hf_folder(mdir):
    if os.path.exists(os.path.join(mdir, "model.safetensors")):
        return read_safetensors(os.path.join(mdir, "model.safetensors"))
    with open(os.path.join(mdir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = read_safetensors(os.path.join(mdir, shard))
        assert all(index["weight_map"][k] == shard for k in part)
        out.update(part)
    assert set(out) == set(index["weight_map"])
    total = sum(t.numel() * t.element_size() for t in out.values())
    assert total == index["metadata"]["total_size"]
    return out


# ---------------------------------------------------------------------------
# HF models
# ---------------------------------------------------------------------------

def model_cfg(name):
    arch, vocab, tied, dtype, _, _ = MODELS[name]
    return {**COMMON, "arch": arch, "vocab_size": vocab, "tied": tied, "dtype": dtype}


def param_specs(c):
    """(hf name, shape, kind) in HF checkpoint order: the native fixtures' list, with
    Llama's missing q/k/v biases."""
    return native_param_specs(
        {**c, "tie_word_embeddings": c["tied"], "attention_bias": c["arch"] == "qwen2"})


def init_params(name):
    c = model_cfg(name)
    torch.manual_seed(MODELS[name][5])
    params = collections.OrderedDict()
    for pname, shape, kind in param_specs(c):
        t = torch.randn(shape, dtype=torch.float32)
        t = 1.0 + NORM_STD * t if kind == "norm" else INIT_STD * t
        params[pname] = t.to(c["dtype"]).contiguous()
    return params


def hf_config(name):
    c = model_cfg(name)
    dtype = "bfloat16" if c["dtype"] == torch.bfloat16 else "float32"
    cfg = {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "num_attention_heads": c["num_attention_heads"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": c["rope_theta"],
        "tie_word_embeddings": c["tied"],
        "torch_dtype": dtype,
        "transformers_version": "4.51.3",
        "use_cache": True,
        "vocab_size": c["vocab_size"],
    }
    V = c["vocab_size"]
    if c["arch"] == "qwen2":
        cfg.update(
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            bos_token_id=V - 3,
            eos_token_id=V - 1,
            max_window_layers=c["num_hidden_layers"],
            sliding_window=c["max_position_embeddings"],
            use_sliding_window=False,
        )
    else:
        cfg.update(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            bos_token_id=1,
            eos_token_id=2,
            attention_bias=False,
            mlp_bias=False,
            head_dim=c["hidden_size"] // c["num_attention_heads"],
            pretraining_tp=1,
        )
    return dict(sorted(cfg.items()))


def tokenizer_files(name):
    """Minimal byte-level-BPE-style tokenizer with exactly vocab_size ids."""
    c = model_cfg(name)
    V = c["vocab_size"]
    if c["arch"] == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        special_ids = list(range(V - 3, V))
        n_regular = V - 3
        first_regular = 0
    else:
        specials = ["<unk>", "<s>", "</s>"]
        special_ids = [0, 1, 2]
        n_regular = V - 3
        first_regular = 3
    base = ["Ġ"] + list("abcdefghijklmnopqrst")
    merges, tokens = [], list(base)
    pairs = [("Ġ", "a"), ("a", "b"), ("c", "d"), ("e", "f"), ("Ġ", "ab"), ("g", "h"),
             ("i", "j"), ("k", "l"), ("Ġ", "cd"), ("m", "n"), ("o", "p"), ("q", "r")]
    for a, b in pairs:
        if len(tokens) >= n_regular:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens = tokens[:n_regular]
    assert len(tokens) == n_regular
    vocab = {tok: first_regular + i for i, tok in enumerate(tokens)}
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in zip(specials, special_ids)
    ]
    full_vocab = dict(vocab)
    if c["arch"] == "llama":
        full_vocab = {**{s: i for s, i in zip(specials, special_ids)}, **vocab}
    bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if c["arch"] == "qwen2" else None,
        "pre_tokenizer": bytelevel,
        "post_processor": bytelevel,
        "decoder": bytelevel,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>" if c["arch"] == "llama" else None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": full_vocab,
            "merges": merges,
        },
    }
    decoder = {
        str(i): {k: v for k, v in a.items() if k != "id"} for i, a in zip(special_ids, added)
    }
    if c["arch"] == "qwen2":
        tok_cfg = {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": decoder,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": c["max_position_embeddings"],
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
        special_map = {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
        }
        gen = {
            "bos_token_id": V - 3,
            "do_sample": True,
            "eos_token_id": [V - 1, V - 3],
            "pad_token_id": V - 3,
            "temperature": 0.7,
            "top_p": 0.8,
            "transformers_version": "4.51.3",
        }
    else:
        tok_cfg = {
            "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": decoder,
            "bos_token": "<s>",
            "clean_up_tokenization_spaces": False,
            "eos_token": "</s>",
            "model_max_length": c["max_position_embeddings"],
            "pad_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": "<unk>",
        }
        special_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        gen = {
            "bos_token_id": 1,
            "do_sample": True,
            "eos_token_id": 2,
            "temperature": 0.6,
            "top_p": 0.9,
            "transformers_version": "4.51.3",
        }
    merges_txt = "#version: 0.2\n" + "".join(m + "\n" for m in merges)
    return tokenizer, tok_cfg, vocab, merges_txt, special_map, gen


def write_hf(name, params):
    mdir = os.path.join(FIX, "hf", name)
    os.makedirs(mdir)
    write_json(os.path.join(mdir, "config.json"), hf_config(name))
    tokenizer, tok_cfg, vocab, merges_txt, special_map, gen = tokenizer_files(name)
    write_json(os.path.join(mdir, "generation_config.json"), gen)
    write_json(os.path.join(mdir, "tokenizer.json"), tokenizer)
    write_json(os.path.join(mdir, "tokenizer_config.json"), tok_cfg)
    write_json(os.path.join(mdir, "vocab.json"), vocab)
    write_text(os.path.join(mdir, "merges.txt"), merges_txt)
    write_json(os.path.join(mdir, "special_tokens_map.json"), special_map)
    tensors = list(params.items())
    meta = {"format": "pt"}
    if MODELS[name][4] == 1:
        write_safetensors(os.path.join(mdir, "model.safetensors"), tensors, meta)
        return
    sizes = [t.numel() * t.element_size() for _, t in tensors]
    half, acc, cut = sum(sizes) / 2, 0, 0
    while acc + sizes[cut] <= half:
        acc += sizes[cut]
        cut += 1
    parts = [tensors[:cut], tensors[cut:]]
    weight_map, total = {}, 0
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        total += write_safetensors(os.path.join(mdir, fname), part, meta)
        weight_map.update({n: fname for n, _ in part})
    write_json(
        os.path.join(mdir, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )


# ---------------------------------------------------------------------------
# Stand-ins for globals of packages torch 1.13 does not have
# ---------------------------------------------------------------------------

def _module(name):
    if name in sys.modules:
        return sys.modules[name]
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(_module(parent), child, mod)
    return mod


def _register(obj, module, qualname):
    obj.__module__ = module
    obj.__qualname__ = qualname
    obj.__name__ = qualname
    setattr(_module(module), qualname, obj)
    return obj


# megatron.core.transformer.enums.AttnBackend
AttnBackend = enum.Enum(
    "AttnBackend",
    [("flash", 1), ("fused", 2), ("unfused", 3), ("local", 4), ("auto", 5)],
    module="megatron.core.transformer.enums",
)
_register(AttnBackend, "megatron.core.transformer.enums", "AttnBackend")

# megatron.core.enums.ModelType (Megatron's pretrain() stores it in args.model_type).
# Python >= 3.11 pickles Enum members as getattr(Cls, "name") (AttnBackend above);
# this one is pickled the Python <= 3.10 way, Cls(value), so both forms occur.
ModelType = enum.Enum(
    "ModelType",
    [("encoder_or_decoder", 1), ("encoder_and_decoder", 2), ("retro_encoder", 3),
     ("retro_decoder", 4)],
    module="megatron.core.enums",
)
ModelType.__reduce_ex__ = lambda self, proto: (self.__class__, (self._value_,))
_register(ModelType, "megatron.core.enums", "ModelType")


class DTensor:  # torch.distributed.tensor.DTensor (only referenced as a global)
    pass


_register(DTensor, "torch.distributed.tensor", "DTensor")


class DeviceMesh:  # torch.distributed.device_mesh.DeviceMesh
    def __init__(self, device_type, mesh, mesh_dim_names):
        self.device_type = device_type
        self.mesh = mesh
        self.mesh_dim_names = mesh_dim_names


_register(DeviceMesh, "torch.distributed.device_mesh", "DeviceMesh")


@dataclasses.dataclass(frozen=True)
class Shard:  # torch.distributed.tensor.placement_types.Shard
    dim: int


@dataclasses.dataclass(frozen=True)
class Replicate:  # torch.distributed.tensor.placement_types.Replicate
    pass


_register(Shard, "torch.distributed.tensor.placement_types", "Shard")
_register(Replicate, "torch.distributed.tensor.placement_types", "Replicate")

TensorMeta = typing.NamedTuple(
    "TensorMeta", [("shape", torch.Size), ("stride", tuple), ("dtype", torch.dtype)]
)
_register(TensorMeta, "torch.distributed.tensor._dtensor_spec", "TensorMeta")


@dataclasses.dataclass
class DTensorSpec:  # torch.distributed.tensor._dtensor_spec.DTensorSpec
    mesh: DeviceMesh
    placements: tuple
    tensor_meta: typing.Optional[TensorMeta] = None

    def __post_init__(self):
        self._hash = None  # as the real one caches its hash


_register(DTensorSpec, "torch.distributed.tensor._dtensor_spec", "DTensorSpec")

if not hasattr(torch._utils, "_rebuild_wrapper_subclass"):  # present in 1.13; just in case

    def _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device,
                                  requires_grad):
        raise NotImplementedError

    _register(_rebuild_wrapper_subclass, "torch._utils", "_rebuild_wrapper_subclass")

# torch >= 2 pickles layouts as the global torch.strided; torch 1.13 cannot.
copyreg.pickle(torch.layout, lambda layout: str(layout).rpartition(".")[2])


class DTensorPickle:
    """Pickles exactly like a torch>=2 DTensor (Tensor.__reduce_ex__ of a wrapper
    subclass: _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, args, state))."""

    def __init__(self, full, local, spec, rank):
        self.full_shape = tuple(full.shape)
        self.full_stride = tuple(full.stride())
        self.dtype = full.dtype
        self.local, self.spec, self.rank = local, spec, rank

    def __reduce_ex__(self, proto):
        args = (DTensor, self.dtype, self.full_shape, self.full_stride, 0, torch.strided,
                torch.device("cuda", self.rank), False)
        state = (None, {"_local_tensor": self.local, "_spec": self.spec})
        return (torch._tensor._rebuild_from_type_v2,
                (torch._utils._rebuild_wrapper_subclass, DTensor, args, state))


# ---------------------------------------------------------------------------
# Megatron
# ---------------------------------------------------------------------------

def padded_vocab(vocab, tp):
    m = MAKE_VOCAB_DIVISIBLE_BY * tp
    return (vocab + m - 1) // m * m


def pad_rows(t, rows):
    if t.shape[0] == rows:
        return t
    return torch.cat([t, torch.zeros(rows - t.shape[0], *t.shape[1:], dtype=t.dtype)])


def fused_qkv(q, k, v, G, hd):
    """[G*(q/g+2)*hd, ...]: per kv group its query heads, its k head, its v head."""
    rest = q.shape[1:]
    qg = q.reshape(G, -1, *rest)
    kg = k.reshape(G, hd, *rest)
    vg = v.reshape(G, hd, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


EXTRA_MODULES = ["self_attention.core_attention", "self_attention.linear_proj",
                 "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"]


def extra_state(global_layer, module_idx):
    kind = (global_layer * len(EXTRA_MODULES) + module_idx) % 3
    if kind == 0:
        return None
    if kind == 1:
        return io.BytesIO(b"")
    return torch.empty(0, dtype=torch.uint8)


def megatron_model(hf, c, tp, pp, t, p, te):
    """Local megatron-core GPT state dict of rank (t, p)."""
    H, NH, G = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, L = H // NH, c["num_hidden_layers"]
    vpad = padded_vocab(c["vocab_size"], tp)
    sd = collections.OrderedDict()

    def put(key, tensor):
        sd[key] = tensor.clone().contiguous()  # own storage, never a view of hf

    if p == 0:
        put("embedding.word_embeddings.weight",
            pad_rows(hf["model.embed_tokens.weight"], vpad).chunk(tp, 0)[t])
    per_stage = L // pp
    for li in range(per_stage):
        gi = p * per_stage + li
        src = f"model.layers.{gi}."
        dst = f"decoder.layers.{li}."
        if not te:
            put(dst + "input_layernorm.weight", hf[src + "input_layernorm.weight"])
        else:
            sd[dst + "self_attention.core_attention._extra_state"] = extra_state(gi, 0)
        put(dst + "self_attention.linear_proj.weight",
            hf[src + "self_attn.o_proj.weight"].chunk(tp, 1)[t])
        if te:
            sd[dst + "self_attention.linear_proj._extra_state"] = extra_state(gi, 1)
            put(dst + "self_attention.linear_qkv.layer_norm_weight",
                hf[src + "input_layernorm.weight"])
        a = src + "self_attn."
        put(dst + "self_attention.linear_qkv.weight",
            fused_qkv(hf[a + "q_proj.weight"], hf[a + "k_proj.weight"],
                      hf[a + "v_proj.weight"], G, hd).chunk(tp, 0)[t])
        if c["arch"] == "qwen2":
            put(dst + "self_attention.linear_qkv.bias",
                fused_qkv(hf[a + "q_proj.bias"], hf[a + "k_proj.bias"],
                          hf[a + "v_proj.bias"], G, hd).chunk(tp, 0)[t])
        if te:
            sd[dst + "self_attention.linear_qkv._extra_state"] = extra_state(gi, 2)
            put(dst + "mlp.linear_fc1.layer_norm_weight",
                hf[src + "post_attention_layernorm.weight"])
        else:
            put(dst + "pre_mlp_layernorm.weight", hf[src + "post_attention_layernorm.weight"])
        put(dst + "mlp.linear_fc1.weight",
            torch.cat([hf[src + "mlp.gate_proj.weight"].chunk(tp, 0)[t],
                       hf[src + "mlp.up_proj.weight"].chunk(tp, 0)[t]]))
        if te:
            sd[dst + "mlp.linear_fc1._extra_state"] = extra_state(gi, 3)
        put(dst + "mlp.linear_fc2.weight", hf[src + "mlp.down_proj.weight"].chunk(tp, 1)[t])
        if te:
            sd[dst + "mlp.linear_fc2._extra_state"] = extra_state(gi, 4)
    if p == pp - 1:
        put("decoder.final_layernorm.weight", hf["model.norm.weight"])
        if not c["tied"]:
            put("output_layer.weight", pad_rows(hf["lm_head.weight"], vpad).chunk(tp, 0)[t])
        elif pp > 1:
            put("output_layer.weight",
                pad_rows(hf["model.embed_tokens.weight"], vpad).chunk(tp, 0)[t])
    return sd


def ddp_flat_buffer(sd, transposed_suffix):
    """Re-home every tensor of `sd` into ONE flat storage like Megatron's DDP
    param buffer (laid out in reverse order, 16-element aligned); params whose
    name ends with `transposed_suffix` become non-contiguous .t() views."""
    align = lambda n: (n + 15) // 16 * 16  # noqa: E731
    names = list(sd)
    offsets, off = {}, 0
    for k in reversed(names):
        offsets[k] = off
        off = align(off + sd[k].numel())
    dtype = {sd[k].dtype for k in names}
    assert len(dtype) == 1
    flat = torch.zeros(off, dtype=dtype.pop())
    out = collections.OrderedDict()
    for k in names:
        v, o = sd[k], offsets[k]
        region = flat[o : o + v.numel()]
        if k.endswith(transposed_suffix):
            assert v.dim() == 2
            region.view(v.shape[1], v.shape[0]).copy_(v.t())
            out[k] = region.view(v.shape[1], v.shape[0]).t()
            assert not out[k].is_contiguous()
        else:
            region.view(v.shape).copy_(v)
            out[k] = region.view(v.shape)
        assert torch.equal(out[k], v)
    return out


def megatron_args(case, c, tp, pp, te, rank):
    vpad = padded_vocab(c["vocab_size"], tp)
    bf16 = c["dtype"] == torch.bfloat16
    return argparse.Namespace(
        num_layers=c["num_hidden_layers"],
        hidden_size=c["hidden_size"],
        ffn_hidden_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"],
        kv_channels=c["hidden_size"] // c["num_attention_heads"],
        group_query_attention=True,
        num_query_groups=c["num_key_value_heads"],
        max_position_embeddings=c["max_position_embeddings"],
        seq_length=64,
        position_embedding_type="rope",
        use_rotary_position_embeddings=True,
        rotary_base=int(c["rope_theta"]),
        rotary_percent=1.0,
        normalization="RMSNorm",
        norm_epsilon=c["rms_norm_eps"],
        swiglu=True,
        add_bias_linear=False,
        add_qkv_bias=c["arch"] == "qwen2",
        qk_layernorm=False,
        untie_embeddings_and_output_weights=not c["tied"],
        make_vocab_size_divisible_by=MAKE_VOCAB_DIVISIBLE_BY,
        padded_vocab_size=vpad,
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model=f"hf/{MODELS_BY_CASE[case]}",
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=1,
        num_experts=None,
        sequence_parallel=False,
        data_parallel_size=1,
        world_size=tp * pp,
        rank=rank,
        transformer_impl="transformer_engine" if te else "local",
        attention_backend=AttnBackend.auto,
        model_type=ModelType.encoder_or_decoder,
        params_dtype=c["dtype"],
        bf16=bf16,
        fp16=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        init_method_std=0.02,
        use_distributed_optimizer=False,
        ckpt_format="torch",
        use_dist_ckpt=False,
        seed=1234,
        lr=1e-6,
        min_lr=0.0,
        lr_decay_style="constant",
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.95,
        micro_batch_size=1,
        global_batch_size=8,
        train_iters=1000,
        iteration=ITER,
        consumed_train_samples=ITER * 8,
        save=f"/checkpoints/{case}",
        load=f"/checkpoints/{case}",
    )


MODELS_BY_CASE = {case: spec[0] for case, spec in MEGATRON_CASES.items()}


def rng_snapshot(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
        "rng_tracker_states": {"model-parallel-rng": torch.zeros(8, dtype=torch.uint8)},
    }


def megatron_rank_dir(tp, pp, t, p):
    return f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"


def write_megatron(case, hf):
    base, tp, pp, te, flat = MEGATRON_CASES[case]
    c = model_cfg(base)
    root = os.path.join(FIX, "megatron", case)
    os.makedirs(root)
    write_text(os.path.join(root, "latest_checkpointed_iteration.txt"), str(ITER))
    for p in range(pp):
        for t in range(tp):
            rank = p * tp + t
            model = megatron_model(hf, c, tp, pp, t, p, te)
            if flat:
                model = ddp_flat_buffer(model, "layers.0.self_attention.linear_proj.weight")
            gen = torch.Generator().manual_seed(7000 + rank)
            small = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
            optimizer = {
                "optimizer": {
                    "state": {0: {"exp_avg": small(4) * 1e-3, "exp_avg_sq": small(4).abs() * 1e-6}},
                    "param_groups": [{
                        "lr": 1e-6,
                        "betas": (0.9, 0.95),
                        "eps": 1e-8,
                        "weight_decay": 0.01,
                        "params": [0],
                    }],
                },
                "fp32_from_fp16_params": [[small(4), small(2, 2)]],
            }
            ckpt = {
                "args": megatron_args(case, c, tp, pp, te, rank),
                "checkpoint_version": 3.0,
                "iteration": ITER,
                "model": model,
                "optimizer": optimizer,
                "opt_param_scheduler": {
                    "max_lr": 1e-6,
                    "lr_warmup_steps": 0,
                    "num_steps": ITER,
                    "lr_decay_style": "constant",
                    "lr_decay_steps": 1000,
                    "min_lr": 0.0,
                    "start_wd": 0.01,
                    "end_wd": 0.01,
                    "wd_incr_style": "constant",
                    "wd_incr_steps": 1000,
                },
                "rng_state": [rng_snapshot(100 + rank)],
                "num_floating_point_operations_so_far": 0,
            }
            d = os.path.join(root, f"iter_{ITER:07d}", megatron_rank_dir(tp, pp, t, p))
            os.makedirs(d)
            torch.save(ckpt, os.path.join(d, "model_optim_rng.pt"))


# ---------------------------------------------------------------------------
# verl FSDP
# ---------------------------------------------------------------------------

def write_fsdp(case, hf):
    base, W = FSDP_CASES[case]
    root = os.path.join(FIX, "fsdp", case)
    step = os.path.join(root, f"global_step_{ITER}")
    actor = os.path.join(step, "actor")
    os.makedirs(os.path.join(actor, "huggingface"))
    write_text(os.path.join(root, "latest_checkpointed_iteration.txt"), str(ITER))
    torch.save({"dataloader_state_dict": {"_num_yielded": ITER, "_sampler_iter_yielded": ITER,
                                          "_iterator_finished": False}},
               os.path.join(step, "data.pt"))
    src = os.path.join(FIX, "hf", base)
    for fname in ["config.json", "generation_config.json"] + TOKENIZER_FILES:
        shutil.copyfile(os.path.join(src, fname), os.path.join(actor, "huggingface", fname))
    write_json(os.path.join(actor, "fsdp_config.json"), {"FSDP_version": 1, "world_size": W})

    mesh = DeviceMesh("cuda", torch.arange(W), ("fsdp",))
    for r in range(W):
        sd = collections.OrderedDict()
        if W == 1:
            for k, v in hf.items():
                sd[k] = v.clone()
            if "lm_head.weight" not in sd:  # tied: HF state_dict lists both names
                sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        else:
            for k, v in hf.items():
                if k.endswith("layernorm.weight"):
                    sd[k] = v.clone()  # replicated buffer: a plain full tensor on each rank
                    continue
                if k == "model.norm.weight":
                    placement, local = Replicate(), v.clone()
                else:
                    dim = 1 if k == "model.layers.0.mlp.down_proj.weight" else 0
                    placement = Shard(dim)
                    local = torch.chunk(v, W, dim=dim)[r].clone().contiguous()
                meta = TensorMeta(torch.Size(v.shape), tuple(v.stride()), v.dtype)
                spec = DTensorSpec(mesh=mesh, placements=(placement,), tensor_meta=meta)
                sd[k] = DTensorPickle(v, local, spec, r)
        torch.save(sd, os.path.join(actor, f"model_world_size_{W}_rank_{r}.pt"))

        gen = torch.Generator().manual_seed(9000 + r)
        optim = {
            "state": {0: {"step": torch.tensor(float(ITER)),
                          "exp_avg": torch.randn(4, generator=gen) * 1e-3,
                          "exp_avg_sq": torch.randn(4, generator=gen).abs() * 1e-6}},
            "param_groups": [{"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 0.01, "amsgrad": False, "foreach": None,
                              "maximize": False, "capturable": False,
                              "differentiable": False, "fused": None, "params": [0]}],
        }
        torch.save(optim, os.path.join(actor, f"optim_world_size_{W}_rank_{r}.pt"))
        random.seed(500 + r)
        np.random.seed(500 + r)
        torch.manual_seed(500 + r)
        extra = {
            "lr_scheduler": {"last_epoch": ITER, "_step_count": ITER + 1},
            "rng": {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "random": random.getstate()},
        }
        torch.save(extra, os.path.join(actor, f"extra_state_world_size_{W}_rank_{r}.pt"))


# ---------------------------------------------------------------------------
# Casts
# ---------------------------------------------------------------------------

def edge_list():
    return [
        0.0, -0.0, 1e-8, -1e-8, 1.0, -1.0, 0.1, -2.5, 3.14159265,
        65504.0, 65519.99, 65520.0, -65520.0, 1e38, 3.4e38, -3.4e38,
        3.4028234663852886e38, math.inf, -math.inf,
        # exactly halfway between two bf16 numbers: ties to even, both directions
        1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), -(1 + 3 * 2**-8), 257.0, 259.0,
        1 + 2**-8 + 2**-20,  # just above a tie
        # exactly halfway between two fp16 numbers
        1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), -(1 + 3 * 2**-11), 2049.0, 2051.0,
        # fp16 subnormals and ties among them, fp16 min normal, an f32 denormal
        3e-8, 6e-5, -6e-5, 2**-24, 2**-25, 3 * 2**-25, 2**-14, 1e-40,
    ]


def edge_values():
    return torch.tensor(edge_list(), dtype=torch.float32)


def bf16_reference(x):
    """Independent float32 -> bf16 round-to-nearest-even on the bit patterns."""
    b = x.numpy().view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return torch.from_numpy(rounded.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)


def write_casts(hf):
    d = os.path.join(FIX, "cast")
    os.makedirs(d)
    meta = {"format": "pt"}
    untied, tied = hf["untied"], hf["tied"]
    write_safetensors(os.path.join(d, "untied-bf16.safetensors"),
                      [(k, v.to(torch.bfloat16)) for k, v in untied.items()], meta)
    write_safetensors(os.path.join(d, "untied-fp16.safetensors"),
                      [(k, v.to(torch.float16)) for k, v in untied.items()], meta)
    write_safetensors(os.path.join(d, "tied-fp32.safetensors"),
                      [(k, v.to(torch.float32)) for k, v in tied.items()], meta)
    x = edge_values()
    xb, xh = x.to(torch.bfloat16), x.to(torch.float16)
    write_safetensors(os.path.join(d, "edge.safetensors"), [
        ("x", x), ("x.bf16", xb), ("x.fp16", xh),
        ("x.bf16.f32", xb.to(torch.float32)), ("x.fp16.f32", xh.to(torch.float32)),
    ], meta)


# ---------------------------------------------------------------------------
# Self checks (independent readers)
# ---------------------------------------------------------------------------

class _EnumStub:
    """Megatron enum members. Python >= 3.11 pickles an Enum member as getattr(EnumClass, name),
    older Pythons as EnumClass(value); accept both."""

    def __init__(self, value):
        self.value = value


def _safe_getattr(obj, name):
    assert obj is _EnumStub, obj  # only enum members may use getattr
    return _EnumStub(name)


class _StubDT:
    """What a loaded DTensor becomes in the checks."""

    def __init__(self, args, state):
        self.args, self.state = args, state


class _StubObj:  # DeviceMesh / DTensorSpec / Shard / Replicate
    pass


class _StubDTensorCls:
    pass


class _StubMesh(_StubObj):
    pass


class _StubSpec(_StubObj):
    pass


class _StubShard(_StubObj):
    pass


class _StubReplicate(_StubObj):
    pass


_StubTensorMeta = collections.namedtuple("_StubTensorMeta", "shape stride dtype")


def _stub_wrapper_subclass(*args):
    raise AssertionError("only used through _rebuild_from_type_v2")


def _stub_from_type_v2(func, cls, args, state):
    assert func is _stub_wrapper_subclass and cls is _StubDTensorCls
    return _StubDT(args, state)


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch", "strided"): torch.strided,
    ("torch", "float32"): torch.float32,
    ("torch", "bfloat16"): torch.bfloat16,
    ("argparse", "Namespace"): argparse.Namespace,
    ("numpy.core.multiarray", "_reconstruct"): np.core.multiarray._reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): __import__("_codecs").encode,
    ("builtins", "bytes"): bytes,
    ("_io", "BytesIO"): io.BytesIO,
    ("megatron.core.transformer.enums", "AttnBackend"): _EnumStub,
    ("megatron.core.enums", "ModelType"): _EnumStub,
    ("builtins", "getattr"): _safe_getattr,
    ("torch._tensor", "_rebuild_from_type_v2"): _stub_from_type_v2,
    ("torch._utils", "_rebuild_wrapper_subclass"): _stub_wrapper_subclass,
    ("torch.distributed.tensor", "DTensor"): _StubDTensorCls,
    ("torch.distributed.device_mesh", "DeviceMesh"): _StubMesh,
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"): _StubSpec,
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta"): _StubTensorMeta,
    ("torch.distributed.tensor.placement_types", "Shard"): _StubShard,
    ("torch.distributed.tensor.placement_types", "Replicate"): _StubReplicate,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "__builtin__":
            module = "builtins"
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} not allowed") from None


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    return torch.as_strided(storage, tuple(size), tuple(stride), offset)


_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "BFloat16Storage": torch.bfloat16,
    "HalfStorage": torch.float16,
    "ByteStorage": torch.uint8,
    "LongStorage": torch.int64,
}
for _n, _dt in _STORAGE_DTYPES.items():
    _ALLOWED[("torch", _n)] = _dt
_ALLOWED[("torch._utils", "_rebuild_tensor_v2")] = _rebuild_tensor_v2


def load(path):
    """Independent torch.save zip reader (this Debian torch 1.13 build ignores
    torch.load's pickle_module argument, and a converter reads the zip this way
    anyway): data.pkl through the restricted unpickler, storages from data/<key>."""
    with zipfile.ZipFile(path) as z:
        (pkl,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        prefix = pkl[: -len("data.pkl")]
        storages = {}

        def persistent_load(pid):
            typename, dtype, key, location, numel = pid
            assert typename == "storage" and location == "cpu", pid
            if key not in storages:
                raw = z.read(prefix + "data/" + key)
                if raw:
                    storages[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
                else:
                    storages[key] = torch.empty(0, dtype=dtype)
                assert storages[key].numel() == numel
            return storages[key]

        unpickler = _RestrictedUnpickler(io.BytesIO(z.read(pkl)), encoding="utf-8")
        unpickler.persistent_load = persistent_load
        return unpickler.load()


def pickle_bytes(path):
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        return z.read(name)


def check_megatron(case, hf):
    base, tp, pp, te, flat = MEGATRON_CASES[case]
    c = model_cfg(base)
    root = os.path.join(FIX, "megatron", case)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read())
    H, NH, G = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, L, V, I = H // NH, c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    qpg = NH // G
    files = {}
    for name in sorted(os.listdir(os.path.join(root, f"iter_{it:07d}"))):
        m = re.fullmatch(r"mp_rank_(\d\d)(?:_(\d\d\d))?", name)
        assert m, name
        t, p = int(m.group(1)), int(m.group(2) or 0)
        path = os.path.join(root, f"iter_{it:07d}", name, "model_optim_rng.pt")
        raw = pickle_bytes(path)
        assert b"megatron.core.transformer.enums\nAttnBackend" in raw
        assert b"megatron.core.enums\nModelType" in raw
        files[(t, p)] = load(path)
    assert set(files) == {(t, p) for t in range(tp) for p in range(pp)}
    extra_kinds = set()
    for (t, p), ck in files.items():
        a = ck["args"]
        assert ck["iteration"] == it == ITER and ck["checkpoint_version"] == 3.0
        assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (tp, pp)
        assert a.model_type.value == 1, "ModelType pickled as ModelType(1)"
        assert a.attention_backend.value == "auto", "pickled as getattr(AttnBackend, 'auto')"
        assert a.params_dtype == c["dtype"]
        assert a.untie_embeddings_and_output_weights == (not c["tied"])
        for k, v in ck["model"].items():
            if k.endswith("_extra_state"):
                extra_kinds.add(type(v).__name__)
            else:
                assert v.dtype == c["dtype"], k
        if flat:
            ts = list(ck["model"].values())
            ptrs = {v.storage().data_ptr() for v in ts}
            assert len(ptrs) == 1, "flat buffer: one shared storage"
            assert sum(v.storage_offset() > 0 for v in ts) == len(ts) - 1
            assert any(not v.is_contiguous() for v in ts)
    if te:
        assert extra_kinds == {"NoneType", "BytesIO", "Tensor"}, extra_kinds
    else:
        assert not extra_kinds

    # Independent merge: explicit index arithmetic on the concatenated shards.
    per = L // pp
    got = {}
    used = {k: set() for k in files}

    def take(t, p, key):
        used[(t, p)].add(key)
        return files[(t, p)]["model"][key]

    def same_on_all_tp(p, key):
        vals = [take(t, p, key) for t in range(tp)]
        assert all(torch.equal(vals[0], v) for v in vals[1:]), key
        return vals[0]

    emb = torch.cat([take(t, 0, "embedding.word_embeddings.weight") for t in range(tp)], 0)
    assert emb.shape[0] == padded_vocab(V, tp) and not emb[V:].any()
    got["model.embed_tokens.weight"] = emb[:V]
    for gi in range(L):
        p, li = gi // per, gi % per
        d, s = f"decoder.layers.{li}.", f"model.layers.{gi}."
        ln1 = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
        ln2 = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
        got[s + "input_layernorm.weight"] = same_on_all_tp(p, d + ln1)
        got[s + "post_attention_layernorm.weight"] = same_on_all_tp(p, d + ln2)
        if te:
            for mod in EXTRA_MODULES:
                for t in range(tp):
                    take(t, p, d + mod + "._extra_state")
        names = ["weight"] + (["bias"] if c["arch"] == "qwen2" else [])
        for wb in names:
            fused = torch.cat([take(t, p, d + f"self_attention.linear_qkv.{wb}")
                               for t in range(tp)], 0)
            assert fused.shape[0] == G * (qpg + 2) * hd
            block = lambda j: fused[j * hd : (j + 1) * hd]  # noqa: E731  head-sized row block
            q = [block(h // qpg * (qpg + 2) + h % qpg) for h in range(NH)]
            k = [block(g * (qpg + 2) + qpg) for g in range(G)]
            v = [block(g * (qpg + 2) + qpg + 1) for g in range(G)]
            got[s + f"self_attn.q_proj.{wb}"] = torch.cat(q, 0)
            got[s + f"self_attn.k_proj.{wb}"] = torch.cat(k, 0)
            got[s + f"self_attn.v_proj.{wb}"] = torch.cat(v, 0)
        got[s + "self_attn.o_proj.weight"] = torch.cat(
            [take(t, p, d + "self_attention.linear_proj.weight") for t in range(tp)], 1)
        fc1 = [take(t, p, d + "mlp.linear_fc1.weight") for t in range(tp)]
        assert all(x.shape[0] == 2 * I // tp for x in fc1)
        got[s + "mlp.gate_proj.weight"] = torch.cat([x[: I // tp] for x in fc1], 0)
        got[s + "mlp.up_proj.weight"] = torch.cat([x[I // tp :] for x in fc1], 0)
        got[s + "mlp.down_proj.weight"] = torch.cat(
            [take(t, p, d + "mlp.linear_fc2.weight") for t in range(tp)], 1)
    got["model.norm.weight"] = same_on_all_tp(pp - 1, "decoder.final_layernorm.weight")
    has_out = any("output_layer.weight" in files[(t, pp - 1)]["model"] for t in range(tp))
    assert has_out == (not c["tied"] or pp > 1)
    if has_out:
        out = torch.cat([take(t, pp - 1, "output_layer.weight") for t in range(tp)], 0)
        assert not out[V:].any()
        if c["tied"]:
            assert torch.equal(out, emb)
        else:
            got["lm_head.weight"] = out[:V]
    for key, ck in files.items():
        assert used[key] == set(ck["model"]), set(ck["model"]) - used[key]
    assert set(got) == set(hf), set(got) ^ set(hf)
    for k in hf:
        assert got[k].dtype == hf[k].dtype and torch.equal(got[k], hf[k]), k
    return len(files)


def check_fsdp(case, hf):
    base, W = FSDP_CASES[case]
    actor = os.path.join(FIX, "fsdp", case, f"global_step_{ITER}", "actor")
    with open(os.path.join(actor, "fsdp_config.json")) as f:
        assert json.load(f) == {"FSDP_version": 1, "world_size": W}
    for fname in ["config.json", "generation_config.json"] + TOKENIZER_FILES:
        with open(os.path.join(actor, "huggingface", fname), "rb") as a, \
                open(os.path.join(FIX, "hf", base, fname), "rb") as b:
            assert a.read() == b.read(), fname
    hf_files = os.listdir(os.path.join(actor, "huggingface"))
    assert not any(n.endswith(".safetensors") for n in hf_files)
    ranks = []
    for r in range(W):
        path = os.path.join(actor, f"model_world_size_{W}_rank_{r}.pt")
        raw = pickle_bytes(path)
        if W > 1:
            for g in [b"torch._tensor\n_rebuild_from_type_v2",
                      b"torch._utils\n_rebuild_wrapper_subclass",
                      b"torch.distributed.tensor\nDTensor", b"torch\nstrided",
                      b"torch.distributed.tensor._dtensor_spec\nDTensorSpec",
                      b"torch.distributed.tensor._dtensor_spec\nTensorMeta",
                      b"torch.distributed.device_mesh\nDeviceMesh",
                      b"torch.distributed.tensor.placement_types\nShard",
                      b"torch.distributed.tensor.placement_types\nReplicate"]:
                assert g in raw, g
        ranks.append(load(path))
        load(os.path.join(actor, f"optim_world_size_{W}_rank_{r}.pt"))
        extra = load(os.path.join(actor, f"extra_state_world_size_{W}_rank_{r}.pt"))
        assert extra["lr_scheduler"]["last_epoch"] == ITER
    keys = list(ranks[0])
    assert all(list(sd) == keys for sd in ranks)
    expect = list(hf) + (["lm_head.weight"] if "lm_head.weight" not in hf else [])
    assert keys == expect, keys
    if W == 1:
        sd = ranks[0]
        assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]
        for k, v in hf.items():
            assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k
        return {"plain": len(keys)}
    kinds = collections.Counter()
    for k in keys:
        vals = [sd[k] for sd in ranks]
        if isinstance(vals[0], torch.Tensor):
            assert all(torch.equal(vals[0], v) for v in vals[1:]), k
            full = vals[0]
            kinds["plain"] += 1
        else:
            locals_ = []
            for r, dt in enumerate(vals):
                cls, dtype, size, stride, off, layout, device, grad = dt.args
                assert cls is _StubDTensorCls and off == 0 and layout == torch.strided
                assert device == torch.device("cuda", r) and grad is False
                dict_state, slots = dt.state
                assert dict_state is None and set(slots) == {"_local_tensor", "_spec"}
                spec = slots["_spec"]
                mesh = spec.mesh
                assert mesh.device_type == "cuda" and mesh.mesh_dim_names == ("fsdp",)
                assert torch.equal(mesh.mesh, torch.arange(W))
                meta = spec.tensor_meta
                assert tuple(meta.shape) == tuple(size) == tuple(hf[k].shape)
                assert tuple(meta.stride) == tuple(stride) == tuple(hf[k].stride())
                assert meta.dtype == dtype == hf[k].dtype
                (placement,) = spec.placements
                locals_.append(slots["_local_tensor"])
            if isinstance(placement, _StubReplicate):
                assert all(torch.equal(locals_[0], v) for v in locals_[1:])
                full = locals_[0]
                kinds["Replicate"] += 1
            else:
                assert isinstance(placement, _StubShard)
                full = torch.cat(locals_, placement.dim)
                kinds[f"Shard({placement.dim})"] += 1
        assert full.dtype == hf[k].dtype and torch.equal(full, hf[k]), k
    return dict(kinds)


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def check_casts(hf):
    d = os.path.join(FIX, "cast")
    for fname, src, dtype in [("untied-bf16", "untied", torch.bfloat16),
                              ("untied-fp16", "untied", torch.float16),
                              ("tied-fp32", "tied", torch.float32)]:
        got = read_safetensors(os.path.join(d, fname + ".safetensors"))
        assert list(got) == list(hf[src])
        for k, v in hf[src].items():
            assert got[k].dtype == dtype
            if dtype == torch.float16:
                ref = torch.from_numpy(v.numpy().astype(np.float16))
            elif dtype == torch.bfloat16:
                ref = bf16_reference(v)
            else:  # bf16 -> f32 is exact: bits << 16
                bits = v.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
                ref = torch.from_numpy(bits.view(np.float32).copy())
            assert ref.dtype == dtype
            assert torch.equal(_bits(got[k]), _bits(ref.reshape(v.shape))), k
    e = read_safetensors(os.path.join(d, "edge.safetensors"))
    x = e["x"]
    assert torch.equal(e["x.bf16"].view(torch.int16), bf16_reference(x).view(torch.int16))
    with np.errstate(over="ignore"):
        h = torch.from_numpy(x.numpy().astype(np.float16))
    assert torch.equal(e["x.fp16"].view(torch.int16), h.view(torch.int16))
    assert torch.equal(e["x.bf16.f32"].view(torch.int32), e["x.bf16"].float().view(torch.int32))
    assert torch.equal(e["x.fp16.f32"].view(torch.int32), e["x.fp16"].float().view(torch.int32))
    # spot checks of the rounding cases
    xb, xh = e["x.bf16.f32"].tolist(), e["x.fp16.f32"].tolist()
    xs = edge_list()
    assert len(set(xs)) == len(xs) - 1  # only 0.0 == -0.0
    at = lambda v: xs.index(v)  # noqa: E731
    assert xb[at(1 + 2**-8)] == 1.0 and xb[at(1 + 3 * 2**-8)] == 1 + 2**-6
    assert xb[at(257.0)] == 256.0 and xb[at(259.0)] == 260.0 and xb[at(3.4e38)] == math.inf
    assert xh[at(1 + 2**-11)] == 1.0 and xh[at(1 + 3 * 2**-11)] == 1 + 2**-9
    assert xh[at(65520.0)] == math.inf and xh[at(65519.99)] == 65504.0
    assert xh[at(2**-25)] == 0.0 and xh[at(3 * 2**-25)] == 2**-23 and xh[at(3e-8)] == 2**-24
    return len(xs)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def tree_lines(root):
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if rel != ".":
            lines.append("  " * (depth - 1) + os.path.basename(dirpath) + "/")
        for fn in sorted(filenames):
            size = os.path.getsize(os.path.join(dirpath, fn))
            lines.append("  " * depth + f"{fn}  ({size} B)")
    return lines


README = """# Checkpoint-conversion fixtures

Generated by `test/ckpt/make_fixtures.py`; do not edit by hand. Regenerate (wipes
and rewrites this folder, byte-identical on rerun) with:

    /usr/bin/python3 test/ckpt/make_fixtures.py

The script's docstring documents every layout in detail.

- `hf/untied`, `hf/tied`, `hf/llama`: the original Hugging Face folders (the truth).
  untied = qwen2 F32 with lm_head; tied = qwen2 BF16, two shards, no lm_head;
  llama = llama F32, vocab 30, no attention biases.
- `megatron/<case>/`: Megatron-LM legacy torch checkpoints (iteration 300) made
  from those weights:
  - `tp1-pp1-te-untied`, `tp2-pp1-te-untied`: untied, Transformer Engine names
  - `tp1-pp2-plain-tied`, `tp2-pp2-te-tied`: tied BF16; the last stage also
    holds `output_layer.weight` (a copy of the embedding)
  - `tp2-pp2-plain-untied`: all params of a file are views of one flat buffer;
    `decoder.layers.0.self_attention.linear_proj.weight` is non-contiguous
  - `tp2-pp1-te-llama`: vocab 30 padded to 32 with zero rows (drop them)
  - `tp2-pp1-te-tied`: tied BF16 on one stage: no `output_layer.weight` at all
- `fsdp/<case>/global_step_300/actor/`: verl FSDP checkpoints:
  - `ws1-tied`: one rank, plain tensors, embed_tokens and lm_head share storage
  - `ws2-dtensor-untied`: two ranks, DTensor pickles (Shard(0), Shard(1) for
    `model.layers.0.mlp.down_proj.weight`, Replicate for `model.norm.weight`),
    layer norms as plain full tensors on both ranks (take one)
  - `ws2-lora-untied`: a LoRA run's (make_fsdp_lora_fixture.py): PEFT's names, adapters
    on q_proj, v_proj and down_proj, `lora_adapter/` beside the rank files, and
    `expected.safetensors` (the adapters merged)
- `peft/`: `convert peft-to-hf` references (make_peft_fixtures.py): `adapter-bin/` (a PEFT
  adapter saved as adapter_model.bin) and `expected.safetensors` (merges on a bf16 base, and
  PEFT's own float32 arithmetic)
- `cast/`: dtype-cast references: `untied-bf16`, `untied-fp16`, `tied-fp32`, and
  `edge.safetensors` (`x`, `x.bf16`, `x.fp16`, `x.bf16.f32`, `x.fp16.f32`).
"""


def main():
    if os.path.exists(FIX):
        shutil.rmtree(FIX)
    os.makedirs(FIX)
    write_text(os.path.join(FIX, "README.md"), README)

    for name in MODELS:
        write_hf(name, init_params(name))
    hf = {name: read_hf_folder(os.path.join(FIX, "hf", name)) for name in MODELS}
    for name in MODELS:
        ref = init_params(name)
        assert list(hf[name]) == list(ref), name  # file order == HF order
        assert all(torch.equal(hf[name][k], ref[k]) and hf[name][k].dtype == ref[k].dtype
                   for k in ref), name
        assert ("lm_head.weight" in hf[name]) == (not MODELS[name][2])

    for case, spec in MEGATRON_CASES.items():
        write_megatron(case, hf[spec[0]])
    for case, spec in FSDP_CASES.items():
        write_fsdp(case, hf[spec[0]])
    write_casts(hf)
    # A LoRA run's FSDP checkpoint, from hf/untied (its own script: make_fsdp_lora_fixture.py).
    subprocess.run([sys.executable, os.path.join(HERE, "make_fsdp_lora_fixture.py")], check=True)
    # convert peft-to-hf's references (make_peft_fixtures.py), from test/native/fixtures/lora/.
    subprocess.run([sys.executable, os.path.join(HERE, "make_peft_fixtures.py")], check=True)

    print("checks:")
    for name in MODELS:
        print(f"  hf/{name}: {len(hf[name])} tensors reload bit-exact")
    for case, spec in MEGATRON_CASES.items():
        n = check_megatron(case, hf[spec[0]])
        print(f"  megatron/{case}: {n} rank files merged -> bit-exact vs hf/{spec[0]}")
    for case, spec in FSDP_CASES.items():
        kinds = check_fsdp(case, hf[spec[0]])
        print(f"  fsdp/{case}: reassembled bit-exact vs hf/{spec[0]} {kinds}")
    n = check_casts(hf)
    print(f"  cast: casts match independent numpy rounding; edge vector of {n} values")

    print("\nwrote test/ckpt/fixtures/:")
    total, digest = 0, hashlib.sha256()
    for line in tree_lines(FIX):
        print("  " + line)
    for dirpath, dirnames, filenames in sorted(os.walk(FIX)):
        dirnames.sort()
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            total += os.path.getsize(path)
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, FIX).encode() + b"\0" + f.read())
    print(f"total {total} bytes ({total / 1024:.1f} KiB); content sha256 {digest.hexdigest()}")
    assert total < 2 * 1024 * 1024
    return 0


if __name__ == "__main__":
    sys.exit(main())
