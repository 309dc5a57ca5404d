"""Generate the reference fixtures of a critic trained through LoRA adapters (model/lora.h).

Run from the repository root with Debian's PyTorch (PEFT and transformers are not needed):

    /usr/bin/python3 test/native/make_critic_lora_fixtures.py

A critic's adapters are what verl builds for critic.model.lora_rank > 0 (verl
workers/fsdp_workers.py, the critic's `get_peft_model` with task_type TOKEN_CLS): PEFT's
PeftModelForTokenClassification adds `classifier` and `score` to modules_to_save
(peft/peft_model.py), so the value head is trained in full beside the adapters, as a copy of
the base's (ModulesToSaveWrapper, peft/utils/other.py), saved as base_model.model.score.weight
and base_model.model.score.bias. The forward is PEFT's LoRA on the transformer
(make_lora_fixtures.py's lora_linear) and the value head on the final hidden states
(make_critic_fixtures.py's definitions), in float64 from the float32 values on disk, on the
tiny critic test/native/fixtures/critic-untied.

It (re)writes, under test/native/fixtures/critic-lora/:

  adapter/            a PEFT TOKEN_CLS adapter folder: every linear layer at r 4, alpha 8
                      (A as PEFT's kaiming_uniform_, B normal(0, 0.1) as after training),
                      and the value head: critic-untied's score moved by normal(0, 0.05)
                      (weight) and 0.1 (bias), as after training
  batch.safetensors   make_critic_fixtures.py's batch (rows, masks), with v_old and R placed
                      around this critic's values so that tokens clip on both sides with a
                      margin (its check_margins_and_coverage)
  case.safetensors    values [B, T] (0 where not predicted), vf_loss (token-mean,
                      cliprange_value 0.2) and grad.<PEFT name>: its gradient of every
                      adapter tensor and of the value head

Self checks: central finite differences agree with autograd on one entry of each kind.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_critic_fixtures as mcf  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402

F64 = mf.F64
OUT = os.path.join(mf.FIXTURES, "critic-lora")
R, ALPHA, SEED = 4, 8, 41
SCALING = ALPHA / R
MODE = "token-mean"
HEAD_W, HEAD_B = "base_model.model.score.weight", "base_model.model.score.bias"


def critic_values(params, cfg, ids, mask, adapter, head):
    """values [B,T] aligned as the log-probs, with the adapters and the trained head."""
    p = dict(params)
    p["lm_head.weight"] = head[0]  # mf.forward's last matmul is the head
    rows = mf.forward(p, cfg, ids, mask, mlf.lora_linear(params, adapter, SCALING))[..., 0]
    rows = rows + head[1][0]
    zero = torch.zeros(ids.shape[0], 1, dtype=rows.dtype)
    return torch.cat((zero, rows[:, :-1]), 1).masked_fill(~mf.valid_mask(mask), 0.0)


def loss(params, cfg, batch, adapter, head):
    v = critic_values(params, cfg, batch["input_ids"], batch["attention_mask"], adapter, head)
    return mcf.value_loss(v, batch, MODE)["vf_loss"], v


def main():
    cfg = json.load(open(os.path.join(mcf.CRITIC_DIR, "config.json")))
    stored, _ = mf.read_safetensors(os.path.join(mcf.CRITIC_DIR, "model.safetensors"))
    params = {n: t.to(F64) for n, t in stored.items()}
    adapter = mlf.make_adapter(cfg, params, R, mlf.MODULES, SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    head = (
        (params["score.weight"] + 0.05 * torch.randn(params["score.weight"].shape, generator=gen,
                                                      dtype=F64)).float().to(F64),
        (params["score.bias"] + 0.1 * torch.randn(1, generator=gen, dtype=F64)).float().to(F64),
    )

    def values_of(p, c, ids, mask):
        return critic_values(p, c, ids, mask, adapter, head)

    batch, v = mcf.make_batch(cfg, params, values_of)
    print("   check ok: " + mcf.check_margins_and_coverage(batch, v))

    leaves = {m: (a.clone().requires_grad_(True), b.clone().requires_grad_(True))
              for m, (a, b) in adapter.items()}
    head_leaves = tuple(h.clone().requires_grad_(True) for h in head)
    vf, v = loss(params, cfg, batch, leaves, head_leaves)
    vf.backward()
    grads = {}
    for m, (a, b) in leaves.items():
        grads[mlf.peft_name(m, "A")] = a.grad
        grads[mlf.peft_name(m, "B")] = b.grad
    grads[HEAD_W], grads[HEAD_B] = head_leaves[0].grad, head_leaves[1].grad

    # Finite differences: one entry of an A, a B, the head's weight and its bias.
    first, last = mlf.module_path(0, "q_proj"), mlf.module_path(1, "down_proj")
    checks = [
        (mlf.peft_name(first, "A"), lambda ad, hd: ad[first][0], (1, 2)),
        (mlf.peft_name(last, "B"), lambda ad, hd: ad[last][1], (3, 1)),
        (HEAD_W, lambda ad, hd: hd[0], (0, 5)),
        (HEAD_B, lambda ad, hd: hd[1], (0,)),
    ]
    for name, tensor, at in checks:
        h, vals = 1e-6, []
        for sign in (1, -1):
            ad = {k: (a.clone(), b.clone()) for k, (a, b) in adapter.items()}
            hd = tuple(x.clone() for x in head)
            tensor(ad, hd)[at] += sign * h
            with torch.no_grad():
                vals.append(loss(params, cfg, batch, ad, hd)[0].item())
        fd = (vals[0] - vals[1]) / (2 * h)
        auto = grads[name][at].item()
        assert abs(fd - auto) < 1e-6 * max(1.0, abs(auto)), (name, fd, auto)
    print("   check ok: finite differences agree with autograd (an A, a B, the head)")

    folder = os.path.join(OUT, "adapter")
    os.makedirs(folder, exist_ok=True)
    mf.write_json(os.path.join(folder, "adapter_config.json"), {
        "base_model_name_or_path": "../../critic-untied",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "modules_to_save": ["classifier", "score"],
        "peft_type": "LORA",
        "r": R,
        "target_modules": mlf.MODULES,
        "task_type": "TOKEN_CLS",
        "use_dora": False,
        "use_rslora": False,
    })
    weights = []
    for m, (a, b) in adapter.items():
        weights += [(mlf.peft_name(m, "A"), "F32", a), (mlf.peft_name(m, "B"), "F32", b)]
    weights += [(HEAD_W, "F32", head[0]), (HEAD_B, "F32", head[1])]
    mf.write_safetensors(os.path.join(folder, "adapter_model.safetensors"), weights,
                         {"format": "pt"})
    mf.write_safetensors(os.path.join(OUT, "batch.safetensors"), [
        ("input_ids", "I64", batch["input_ids"]),
        ("attention_mask", "I64", batch["attention_mask"]),
        ("response_mask", "I64", batch["response_mask"]),
        ("values", "F32", batch["values"]),
        ("returns", "F32", batch["returns"]),
    ])
    case = [("values", "F32", v.detach()), ("vf_loss", "F32", vf.detach().reshape(1))]
    case += [(f"grad.{name}", "F32", g) for name, g in grads.items()]
    mf.write_safetensors(os.path.join(OUT, "case.safetensors"), case,
                         {"mode": MODE, "cliprange_value": repr(mcf.CLIPRANGE)})
    print(f"== critic with adapters: r {R}, alpha {ALPHA}, vf_loss {vf.item():.9f}, "
          f"head grad norm {grads[HEAD_W].norm().item():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
