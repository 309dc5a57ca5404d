"""Check the native fixtures (make_fixtures.py) against transformers itself.

Needs torch and transformers >= 5 (a venv: pip install torch transformers); CI does not
run it, the fixtures it checks are committed. From the repository root:

    python test/native/check_transformers.py

For every fixture model it loads the folder with transformers' AutoModelForCausalLM
(Qwen2ForCausalLM), in float64, runs each row of the fixture's batch without its
padding and compares the log-probs and entropies with the stored references. It also checks that the untied-tf5 config.json
is what transformers 5 writes: loading it and saving it again gives the same keys and
values (rope_parameters, dtype, layer_types, no top-level rope_theta or torch_dtype),
and that transformers 5 rewrites the older configs' top-level rope_theta into
rope_parameters with the same value. Exits 1 on any mismatch.
"""

import json
import os
import sys
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

F64 = torch.float64


def logprobs_entropy(model, case):
    """Per-token log-probs and entropies [B,T] of the case, each row run alone without
    its padding (make_fixtures.py checks that padding changes nothing; transformers'
    eager attention turns fully masked padding queries into NaN, which then leak)."""
    ids, mask = case["input_ids"], case["attention_mask"]
    lp = torch.zeros(ids.shape, dtype=F64)
    ent = torch.zeros(ids.shape, dtype=F64)
    for b in range(ids.shape[0]):
        real = mask[b].nonzero()[:, 0]
        row = ids[b, real][None]
        ones = torch.ones_like(row)
        with torch.no_grad():
            logits = model(input_ids=row, attention_mask=ones).logits.to(F64)
        row_lp, row_ent = mf.token_stats(logits, row, ones)
        lp[b, real], ent[b, real] = row_lp[0], row_ent[0]
    return lp, ent


def check_model(name):
    mdir = os.path.join(mf.FIXTURES, name)
    case, _ = mf.read_safetensors(os.path.join(mf.FIXTURES, f"{name}.case.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=F64, attn_implementation="eager")
    model.eval()
    lp, ent = logprobs_entropy(model, case)
    d_lp = (lp - case["ref.logprobs"].to(F64)).abs().max().item()
    d_ent = (ent - case["ref.entropy"].to(F64)).abs().max().item()
    theta = model.config.rope_parameters["rope_theta"]
    print(f"{name}: transformers {type(model).__name__} (rope_theta {theta:g}) vs stored "
          f"references: logprobs max|d|={d_lp:.2e}, entropy max|d|={d_ent:.2e}")
    # The references are float32 roundings of float64 values (about 1e-7 relative);
    # a wrong rope_theta gives differences of order 1.
    return d_lp < 1e-5 and d_ent < 1e-5


def resaved(mdir):
    with tempfile.TemporaryDirectory() as tmp:
        AutoConfig.from_pretrained(mdir).save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            return json.load(f)


def check_configs():
    ok = True
    for name in mf.MODELS:
        mdir = os.path.join(mf.FIXTURES, name)
        with open(os.path.join(mdir, "config.json")) as f:
            ours = json.load(f)
        theirs = resaved(mdir)
        same_theta = theirs["rope_parameters"] == {
            "rope_theta": mf.rope_theta_on_disk(ours),
            "rope_type": "default",
        }
        if name in mf.TF5_FORMAT:
            drop = {"transformers_version"}
            a = {k: v for k, v in ours.items() if k not in drop}
            b = {k: v for k, v in theirs.items() if k not in drop}
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            print(f"{name}: config.json as transformers {transformers.__version__} writes it: "
                  f"{'yes' if not diff else f'no, differs in {diff}'}")
            ok = ok and not diff
        print(f"{name}: transformers' rope_parameters keep the rope_theta: {same_theta}")
        ok = ok and same_theta
    return ok


def main():
    if int(transformers.__version__.split(".")[0]) < 5:
        print(f"transformers {transformers.__version__}: this check needs transformers 5")
        return 1
    ok = check_configs()
    for name in mf.MODELS:
        ok = check_model(name) and ok
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
