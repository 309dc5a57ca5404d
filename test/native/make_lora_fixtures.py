"""Generate the LoRA reference fixtures for the native trainer (model/lora.h).

Run from the repository root with Debian's PyTorch (PEFT and transformers are not needed):

    /usr/bin/python3 test/native/make_lora_fixtures.py

The LoRA forward is PEFT's (huggingface/peft, src/peft/tuners/lora/layer.py): a targeted
linear layer computes `result + lora_B(lora_A(x)) * scaling` (Linear.forward) with
scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (LoraLayer.update_layer);
merging adds scaling * B @ A to the base weight (Linear.get_delta_weight). It runs on the
tiny untied Qwen2 of make_fixtures.py (whose forward takes the projection as `linear`), in
float64 from the float32 values stored on disk.

It (re)writes, under test/native/fixtures/lora/:

  adapter/, rslora/   two PEFT adapter folders (adapter_config.json, adapter_model.safetensors
                      with PEFT's tensor names, F32): every linear layer at r 4, alpha 8; and
                      q/v/up/down at r 8, alpha 4 with use_rslora. A is drawn as PEFT's
                      kaiming_uniform_(a=sqrt(5)) draws it (uniform in +-1/sqrt(in)); B, zero
                      at PEFT's init, is drawn normal(0, 0.1) here, as after training, so that
                      the adapters change the outputs and A has a gradient.
  case.safetensors    per adapter <tag>: <tag>.logprobs and <tag>.entropy [B, T] of the
                      untied model with the adapter on the batch of untied.case.safetensors,
                      <tag>.loss (its weighted loss, -sum(weights * logprobs): `grad --loss
                      weights`), <tag>.grad.<PEFT name> (that loss's gradient of each adapter
                      tensor) and <tag>.merged.<HF name> (each targeted weight with the adapter
                      merged: W + scaling * B @ A).

Self checks: the merged model's log-probs equal the unmerged ones (float64), and central
finite differences agree with one gradient value of each adapter tensor kind.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

F64 = torch.float64
OUT = os.path.join(mf.FIXTURES, "lora")
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# tag: (r, lora_alpha, use_rslora, target_modules, seed)
ADAPTERS = {
    "adapter": (4, 8, False, MODULES, 11),
    "rslora": (8, 4, True, ["q_proj", "v_proj", "up_proj", "down_proj"], 12),
}


def module_path(layer, name):
    kind = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return f"model.layers.{layer}.{kind}.{name}"


def make_adapter(cfg, params, r, targets, seed):
    """{HF module path: (A [r, in], B [out, r])}, float32 values held in float64."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name in targets:
            path = module_path(layer, name)
            out_f, in_f = params[path + ".weight"].shape
            bound = 1.0 / math.sqrt(in_f)  # kaiming_uniform_(a=sqrt(5)) on [r, in]
            a = (torch.rand(r, in_f, generator=gen, dtype=F64) * 2 - 1) * bound
            b = torch.randn(out_f, r, generator=gen, dtype=F64) * 0.1
            out[path] = (a.float().to(F64), b.float().to(F64))
    return out


def peft_name(path, which):
    return f"base_model.model.{path}.lora_{which}.weight"


def lora_linear(params, adapter, scaling):
    """PEFT's Linear.forward without dropout: result + lora_B(lora_A(x)) * scaling."""

    def linear(module, x):
        result = x @ params[module + ".weight"].T
        if module in adapter:
            a, b = adapter[module]
            result = result + ((x @ a.T) @ b.T) * scaling
        return result

    return linear


def weighted(params, cfg, case, linear):
    logits = mf.forward(params, cfg, case["input_ids"], case["attention_mask"], linear)
    lp, ent = mf.token_stats(logits, case["input_ids"], case["attention_mask"])
    return -(case["weights"] * lp).sum(), lp, ent


def build(tag, cfg, params, case):
    r, alpha, rslora, targets, seed = ADAPTERS[tag]
    scaling = alpha / math.sqrt(r) if rslora else alpha / r
    adapter = make_adapter(cfg, params, r, targets, seed)
    leaves = {m: (a.clone().requires_grad_(True), b.clone().requires_grad_(True))
              for m, (a, b) in adapter.items()}
    loss, lp, ent = weighted(params, cfg, case, lora_linear(params, leaves, scaling))
    loss.backward()

    folder = os.path.join(OUT, tag)
    os.makedirs(folder, exist_ok=True)
    mf.write_json(os.path.join(folder, "adapter_config.json"), {
        "base_model_name_or_path": "../../untied",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "peft_type": "LORA",
        "r": r,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": rslora,
    })
    weights = []
    for m, (a, b) in adapter.items():
        weights += [(peft_name(m, "A"), "F32", a), (peft_name(m, "B"), "F32", b)]
    mf.write_safetensors(os.path.join(folder, "adapter_model.safetensors"), weights,
                         {"format": "pt"})

    tensors = [(f"{tag}.logprobs", "F32", lp.detach()), (f"{tag}.entropy", "F32", ent.detach()),
               (f"{tag}.loss", "F32", loss.detach().reshape(1))]
    for m, (a, b) in leaves.items():
        tensors += [(f"{tag}.grad.{peft_name(m, 'A')}", "F32", a.grad),
                    (f"{tag}.grad.{peft_name(m, 'B')}", "F32", b.grad)]
    merged = dict(params)
    for m, (a, b) in adapter.items():
        merged[m + ".weight"] = params[m + ".weight"] + scaling * (b @ a)  # get_delta_weight
        tensors.append((f"{tag}.merged.{m}.weight", "F32", merged[m + ".weight"]))

    # Self checks: merged == unmerged; finite differences of one value of each kind.
    with torch.no_grad():
        _, lp_merged, _ = weighted(merged, cfg, case, None)
        assert (lp_merged - lp).abs().max() < 1e-10, "merged log-probs differ"
        for m in (module_path(0, targets[0]), module_path(1, targets[-1])):
            for which in (0, 1):
                h, at = 1e-6, (1, 2)
                grad = leaves[m][which].grad[at].item()
                vals = []
                for sign in (1, -1):
                    moved = {k: (a.clone(), b.clone()) for k, (a, b) in adapter.items()}
                    moved[m][which][at] += sign * h
                    vals.append(weighted(params, cfg, case,
                                         lora_linear(params, moved, scaling))[0].item())
                fd = (vals[0] - vals[1]) / (2 * h)
                assert abs(fd - grad) < 1e-6 * max(1.0, abs(grad)), (m, which, fd, grad)
    print(f"== {tag}: r {r}, alpha {alpha}, scaling {scaling:.6g}, loss {loss.item():.9f}; "
          "checks ok (merged = unmerged, finite differences)")
    return tensors


def main():
    cfg = json.load(open(os.path.join(mf.FIXTURES, "untied", "config.json")))
    stored, _ = mf.read_safetensors(os.path.join(mf.FIXTURES, "untied", "model.safetensors"))
    params = {n: t.to(F64) for n, t in stored.items()}
    saved, _ = mf.read_safetensors(os.path.join(mf.FIXTURES, "untied.case.safetensors"))
    case = {"input_ids": saved["input_ids"], "attention_mask": saved["attention_mask"],
            "weights": saved["weights"].to(F64)}
    tensors = []
    for tag in ADAPTERS:
        tensors += build(tag, cfg, params, case)
    mf.write_safetensors(os.path.join(OUT, "case.safetensors"), tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
