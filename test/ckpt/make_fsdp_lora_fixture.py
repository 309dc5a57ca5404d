"""A verl FSDP checkpoint of a LoRA run, for `convert fsdp-to-hf` (test/ckpt/convert-cli.test.ts).

Run after make_fixtures.py (which rebuilds test/ckpt/fixtures/ and calls this at its end):

    /usr/bin/python3 test/ckpt/make_fsdp_lora_fixture.py

What verl's FSDP worker saves for a model wrapped by PEFT (verl/workers/fsdp_workers.py,
save_checkpoint; peft/tuners/lora/layer.py for the names): on each of 2 ranks
`model_world_size_2_rank_{r}.pt`, the state dict under PEFT's names
(`base_model.model.<HF name>`, a targeted layer's own weight and bias as
`<module>.base_layer.weight/bias`, its adapter as `<module>.lora_A.default.weight` [r, in]
and `<module>.lora_B.default.weight` [out, r]) with DTensor shards (Shard(0); the layer
norms plain, as make_fixtures.py's ws2 case); and `lora_adapter/`, the PEFT folder verl
writes beside them (adapter_config.json with lora_alpha, adapter_model.safetensors).

Also `expected.safetensors`: the HF tensors with each adapter merged as PEFT's
merge_and_unload does, W + lora_alpha / r * B @ A, computed in float64 and rounded to the
base's float32.

fsdp/ws2-lora-untied: hf/untied's weights, rank 2, lora_alpha 4, on q_proj, v_proj and
down_proj of every layer.
"""

import collections
import importlib.util
import json
import os
import shutil

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("ckpt_make_fixtures", os.path.join(HERE, "make_fixtures.py"))
mf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mf)

CASE, BASE, W = "ws2-lora-untied", "untied", 2
RANK, ALPHA = 2, 4
TARGETS = ["q_proj", "v_proj", "down_proj"]


def main():
    hf = mf.read_hf_folder(os.path.join(mf.FIX, "hf", BASE))
    gen = torch.Generator().manual_seed(4242)
    adapters = {}
    for k, v in hf.items():
        module = k[: -len(".weight")]
        if k.endswith(".weight") and module.split(".")[-1] in TARGETS:
            out, inp = v.shape
            adapters[module] = (torch.randn(RANK, inp, generator=gen) * 0.2,
                                torch.randn(out, RANK, generator=gen) * 0.2)

    root = os.path.join(mf.FIX, "fsdp", CASE)
    if os.path.exists(root):
        shutil.rmtree(root)
    actor = os.path.join(root, f"global_step_{mf.ITER}", "actor")
    os.makedirs(os.path.join(actor, "huggingface"))
    mf.write_text(os.path.join(root, "latest_checkpointed_iteration.txt"), str(mf.ITER))
    src = os.path.join(mf.FIX, "hf", BASE)
    for fname in ["config.json", "generation_config.json"] + mf.TOKENIZER_FILES:
        shutil.copyfile(os.path.join(src, fname), os.path.join(actor, "huggingface", fname))
    mf.write_json(os.path.join(actor, "fsdp_config.json"), {"FSDP_version": 1, "world_size": W})

    # PEFT's state dict: every HF tensor under base_model.model., the targeted modules'
    # base_layer then lora_A, lora_B (registration order in LoraLayer).
    full = collections.OrderedDict()
    for k, v in hf.items():
        module, leaf = k.rsplit(".", 1)
        if module in adapters:
            full[f"base_model.model.{module}.base_layer.{leaf}"] = v
        else:
            full[f"base_model.model.{k}"] = v
        if module in adapters and (leaf == "bias" or f"{module}.bias" not in hf):
            a, b = adapters[module]
            full[f"base_model.model.{module}.lora_A.default.weight"] = a
            full[f"base_model.model.{module}.lora_B.default.weight"] = b

    mesh = mf.DeviceMesh("cuda", torch.arange(W), ("fsdp",))
    for r in range(W):
        sd = collections.OrderedDict()
        for k, v in full.items():
            if k.endswith("layernorm.weight"):
                sd[k] = v.clone()
                continue
            local = torch.chunk(v, W, dim=0)[r].clone().contiguous()
            meta = mf.TensorMeta(torch.Size(v.shape), tuple(v.stride()), v.dtype)
            spec = mf.DTensorSpec(mesh=mesh, placements=(mf.Shard(0),), tensor_meta=meta)
            sd[k] = mf.DTensorPickle(v, local, spec, r)
        torch.save(sd, os.path.join(actor, f"model_world_size_{W}_rank_{r}.pt"))

    lora_dir = os.path.join(actor, "lora_adapter")
    os.makedirs(lora_dir)
    mf.write_json(os.path.join(lora_dir, "adapter_config.json"), {
        "base_model_name_or_path": None, "bias": "none", "fan_in_fan_out": False,
        "lora_alpha": ALPHA, "peft_type": "LORA", "r": RANK, "target_modules": TARGETS,
        "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": False,
    })
    weights = []
    for module, (a, b) in adapters.items():
        weights += [(f"base_model.model.{module}.lora_A.weight", a),
                    (f"base_model.model.{module}.lora_B.weight", b)]
    mf.write_safetensors(os.path.join(lora_dir, "adapter_model.safetensors"), weights)

    scaling = ALPHA / RANK
    expected = []
    for k, v in hf.items():
        module = k[: -len(".weight")]
        if k.endswith(".weight") and module in adapters:
            a, b = adapters[module]
            v = (v.double() + scaling * (b.double() @ a.double())).to(v.dtype)
        expected.append((k, v))
    mf.write_safetensors(os.path.join(root, "expected.safetensors"), expected)

    # Self checks: the ranks' shards rebuild the PEFT state dict; the merge changed the targets.
    ranks = [mf.load(os.path.join(actor, f"model_world_size_{W}_rank_{r}.pt")) for r in range(W)]
    assert list(ranks[0]) == list(full)
    assert sum(1 for k in full if ".lora_" in k) == 2 * len(adapters) == 2 * 3 * 4
    print(f"fsdp/{CASE}: {len(full)} tensors on {W} ranks, {len(adapters)} adapters; "
          f"expected.safetensors with them merged (scaling {scaling})")


if __name__ == "__main__":
    main()
