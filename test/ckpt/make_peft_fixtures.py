"""References for `convert peft-to-hf` beyond test/native/make_lora_fixtures.py's (test/ckpt/peft.test.ts).

Run after test/native/make_lora_fixtures.py (make_fixtures.py calls this at its end):

    /usr/bin/python3 test/ckpt/make_peft_fixtures.py

PEFT and transformers are not needed: PEFT's merge is restated in PyTorch from
huggingface/peft, src/peft/tuners/lora/layer.py (Linear.merge: `base_layer.weight.data +=
get_delta_weight(adapter)`; get_delta_weight: `transpose(B @ A, fan_in_fan_out) * scaling`,
fan_in_fan_out false for a torch.nn.Linear, dispatch_default).

It (re)writes test/ckpt/fixtures/peft/, from test/native/fixtures/untied (F32) and
test/native/fixtures/lora/adapter (r 4, lora_alpha 8, every linear layer):

  adapter-bin/        the same adapter as PEFT's save_pretrained(safe_serialization=False)
                      writes it: adapter_model.bin (torch.save of the state dict) and
                      adapter_config.json (base_model_name_or_path null).
  expected.safetensors, for each targeted weight <name>:
    bf16.<name>       the merge on the base rounded to bf16, as convert computes it:
                      (W + scaling * B @ A) in float64, rounded to float32, then to bf16.
  and for the weights of layer 0:
    peft.<name>       PEFT's own arithmetic on the F32 base: W += (B @ A) * scaling in
                      float32 (B @ A and its product with scaling each rounded to float32).
    peft-bf16.<name>  PEFT's own arithmetic on the bf16 base: the float32 delta added in
                      place to the bf16 weight (computed in float32, rounded to bf16).
"""

import importlib.util
import json
import os
import shutil

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("ckpt_make_fixtures", os.path.join(HERE, "make_fixtures.py"))
mf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mf)

OUT = os.path.join(mf.FIX, "peft")
NATIVE = os.path.join(HERE, "..", "native", "fixtures")
BASE = os.path.join(NATIVE, "untied", "model.safetensors")
ADAPTER = os.path.join(NATIVE, "lora", "adapter")
PREFIX = "base_model.model."


def main():
    with open(os.path.join(ADAPTER, "adapter_config.json")) as f:
        config = json.load(f)
    assert not config["use_rslora"] and not config["fan_in_fan_out"]
    scaling = config["lora_alpha"] / config["r"]
    base = mf.read_safetensors(BASE)
    adapter = mf.read_safetensors(os.path.join(ADAPTER, "adapter_model.safetensors"))

    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    binary = os.path.join(OUT, "adapter-bin")
    os.makedirs(binary)
    # PEFT's save_pretrained: the state dict's tensors, contiguous, under the file's names.
    torch.save({k: v.contiguous() for k, v in adapter.items()},
               os.path.join(binary, "adapter_model.bin"))
    with open(os.path.join(binary, "adapter_config.json"), "w") as f:
        json.dump({**config, "base_model_name_or_path": None}, f, indent=2, sort_keys=True)
        f.write("\n")

    expected = []
    changed = 0
    for name, w in base.items():
        module = name[: -len(".weight")]
        a = adapter.get(f"{PREFIX}{module}.lora_A.weight")
        if a is None:
            continue
        b = adapter[f"{PREFIX}{module}.lora_B.weight"]
        w16 = w.to(torch.bfloat16)
        ours16 = (w16.double() + scaling * (b.double() @ a.double())).float().to(torch.bfloat16)
        delta = (b @ a) * scaling  # get_delta_weight, float32
        peft = w.clone()
        peft += delta
        peft16 = w16.clone()
        peft16 += delta
        assert peft16.dtype == torch.bfloat16
        changed += int((ours16 != peft16).sum())
        expected.append((f"bf16.{name}", ours16))
        if name.startswith("model.layers.0."):  # PEFT's own, for layer 0 (to keep the file small)
            expected += [(f"peft.{name}", peft), (f"peft-bf16.{name}", peft16)]
    mf.write_safetensors(os.path.join(OUT, "expected.safetensors"), expected)

    # Self check: the .bin loads back to the safetensors' tensors.
    loaded = torch.load(os.path.join(binary, "adapter_model.bin"))
    assert list(loaded) == list(adapter) and all(torch.equal(loaded[k], adapter[k]) for k in adapter)
    total = sum(t.numel() for n, t in expected if n.startswith("bf16."))
    print(f"fixtures/peft: {total} merged values; on the bf16 base, {changed} of "
          f"{total} values differ between this merge and PEFT's float32 one")


if __name__ == "__main__":
    main()
