"""Generate PyTorch reference fixtures for the critic of `searchr1-trainer serve`.

Run from the repository root with PyTorch (the committed files were made with torch 2.13
and transformers 5.18 in a venv); no network is needed:

    python test/native/make_critic_fixtures.py

It reads the tiny fp32 model test/native/fixtures/untied (written by make_fixtures.py,
whose model code, safetensors reader and writer it imports) and (re)writes:

  critic-untied/config.json        the untied model's config as a
                                   Qwen2ForTokenClassification with one label
  critic-untied/model.safetensors  the untied model's transformer weights (no lm_head)
                                   and a random value head score.weight [1, 64],
                                   score.bias [1] (F32)
  critic-batch.safetensors         the batch `values` and `update_critic` read:
                                   input_ids, attention_mask, response_mask (int64
                                   [B,T]), values (the rollout's v_old) and returns
                                   (float32 [B,T])
  critic-cases.safetensors         ref.values (float32 [B,T]: the critic's values, 0 where
                                   not predicted), loss_tokens and clipped (int64 [1]:
                                   counts), and for every aggregation mode <m>
                                   (__metadata__["modes"]): <m>.vf_loss, <m>.vf_clipfrac,
                                   <m>.vpred_mean, <m>.grad_norm (float32 [1]),
                                   <m>.grad_norms (float32 [P]: each parameter's gradient
                                   norm, in __metadata__["params"] order) and
                                   <m>.grad.<hf name>: the gradient at the flat indices
                                   sample.<hf name> (int64; tensors of at most SAMPLE_K
                                   entries whole), so that the file stays small.

Definitions (verl's dp_critic, which the native code follows; b = row, t = position):
  row value     r[b,t]  = score.weight . final_norm(hidden[b,t]) + score.bias
  values[b,t]   = r[b,t-1] where predicted, else 0 (aligned as the log-probs)
  predicted     = t >= 1 and attention_mask[b,t] == attention_mask[b,t-1] == 1
  loss token    = predicted and response_mask[b,t] == 1 (v_old and R elsewhere are
                  ignored whatever they hold: this batch holds +-1e30 and +-3e38 there,
                  and response_mask is 1 at some positions that are not predicted)
  v_clip = clamp(v, v_old - c, v_old + c); l1 = (v - R)^2; l2 = (v_clip - R)^2
  vf_loss       = 0.5 * agg(max(l1, l2)), agg = token-mean (sum over the loss tokens of
                  the batch / their count), seq-mean-token-sum / seq-mean-token-mean
                  (mean over the rows with at least one loss token of the row's sum /
                  mean)
  vf_clipfrac   = token-mean of (l2 > l1);  vpred_mean = token-mean of v
  gradients by autograd in float64 from the weights as stored (max as verl's torch.max:
  no token sits near a tie, so the branch taken is never in doubt).

The batch (6 rows x 20): a full row with a hole in its response mask, right padding, left
padding, a left-padded row with no loss token, a row with exactly one loss token, a left
padded row with a long response. v_old = v - d and R = v + e are set from the reference v
so that with cliprange_value c = CLIPRANGE the loss tokens fall, in turn, inside the clip
range and above and below it with the clipped branch winning or not; every token keeps
MARGIN from the clamp edges and from the l1 = l2 tie (checked on the float32 values the
file holds), so float32 error in the native values cannot change a branch.

Self checks (it fails loudly if one does not hold): files reload bit-exact; an
independent per-token loop over Python floats gives the same loss, clip fraction and
mean for every mode; central finite differences agree with autograd; each row run alone
without its padding gives the same values; garbage at ignored positions changes nothing;
every branch is covered. With transformers installed: AutoModelForTokenClassification
loads critic-untied (no missing or unexpected weights, a Qwen2ForTokenClassification with
one label) and gives the same values in float64; in float32 it shows the error scale the
native tolerances are chosen from. With the native binary built (npm run build:native;
SEARCHR1_NATIVE_DIR is honoured): `serve` started with the causal LM folder as the critic
gives values all 0 and its save_checkpoint writes a critic folder that
AutoModelForTokenClassification loads (zero value head, the causal LM's transformer
weights), and critic-untied's values and checkpoint match the reference. Output is
deterministic: rerunning gives byte-identical files.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (sets torch to one thread: byte-identical reruns)

F64 = mf.F64
MODEL = "untied"
CRITIC = "critic-untied"
CRITIC_DIR = os.path.join(mf.FIXTURES, CRITIC)
BATCH_FILE = os.path.join(mf.FIXTURES, "critic-batch.safetensors")
CASES_FILE = os.path.join(mf.FIXTURES, "critic-cases.safetensors")

HEAD_SEED, HEAD_STD, HEAD_BIAS_STD = 4321, 0.15, 0.5
B, T = 6, 20
# Per row: (first real position, number of real tokens, response span [start, end),
# spans with response_mask 0 inside the response, extra positions with response_mask = 1
# that are not predicted).
ROWS = [
    (0, 20, (8, 20), [(12, 14)], [0]),  # no padding, a hole in the response mask
    (0, 15, (6, 15), [], [15, 16, 17, 18, 19]),  # right padding
    (5, 15, (10, 20), [], [0, 1, 5]),  # left padding
    (8, 12, (0, 0), [], [0, 8]),  # left padding, no loss token
    (0, 10, (9, 10), [], [0]),  # right padding, one loss token
    (2, 18, (9, 20), [], []),  # left padding, long response
]
CLIPRANGE = 0.2
# (name, d = v - v_old, e = R - v), cycled over the loss tokens (scaled a little per lap).
KINDS = [
    ("inside", 0.10, 0.60),
    ("above_clipped", 0.35, 0.40),
    ("below_free", -0.40, 0.60),
    ("inside", -0.12, -0.30),
    ("above_free", 0.30, -0.50),
    ("below_clipped", -0.32, -0.45),
]
MARGIN = 0.02
GARBAGE = [1e30, -1e30, 3e38, -3e38, 1e4, -1e4]
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
SAMPLE_K = 256  # sampled entries per parameter with more entries than this


# ---------------------------------------------------------------------------
# The critic: the untied model's transformer and a value head
# ---------------------------------------------------------------------------

def critic_config(cfg):
    """config.json of the critic: what the native save_checkpoint writes for one."""
    out = dict(cfg)
    out["architectures"] = ["Qwen2ForTokenClassification"]
    out["id2label"] = {"0": "LABEL_0"}
    out["label2id"] = {"LABEL_0": 0}
    out["classifier_dropout"] = 0.0
    return out


def critic_specs(cfg):
    """(name, shape) of the critic's parameters, in HF checkpoint order."""
    specs = [(n, s) for n, s, _ in mf.param_specs(cfg) if n != "lm_head.weight"]
    return specs + [("score.weight", (1, cfg["hidden_size"])), ("score.bias", (1,))]


def make_critic():
    mdir = os.path.join(mf.FIXTURES, MODEL)
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    stored, _ = mf.read_safetensors(os.path.join(mdir, "model.safetensors"))
    gen = torch.Generator().manual_seed(HEAD_SEED)
    head = {
        "score.weight": HEAD_STD * torch.randn(1, cfg["hidden_size"], generator=gen),
        "score.bias": HEAD_BIAS_STD * torch.randn(1, generator=gen),
    }
    params = {n: (head[n] if n in head else stored[n]).to(torch.float32).to(F64)
              for n, _ in critic_specs(cfg)}
    return cfg, params


def row_values(params, cfg, ids, mask):
    """r[b,t] = score(final hidden state at t), [B,T], for every position."""
    p = dict(params)
    p["lm_head.weight"] = params["score.weight"]  # mf.forward's last matmul is the head
    return mf.forward(p, cfg, ids, mask)[..., 0] + params["score.bias"][0]


def critic_values(params, cfg, ids, mask):
    """values [B,T] aligned as the log-probs: position t holds r[t-1], 0 if not predicted."""
    r = row_values(params, cfg, ids, mask)
    zero = torch.zeros(ids.shape[0], 1, dtype=r.dtype)
    return torch.cat((zero, r[:, :-1]), 1).masked_fill(~mf.valid_mask(mask), 0.0)


def loss_tokens(batch):
    return mf.valid_mask(batch["attention_mask"]) & (batch["response_mask"] == 1)


# ---------------------------------------------------------------------------
# The loss, vectorised (autograd) and as a plain per-token loop (self check)
# ---------------------------------------------------------------------------

def aggregate(x, m, mode):
    m = m.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / m.sum()
    per_seq = (x * m).sum(-1)
    count = m.sum(-1)
    has = count > 0
    if mode == "seq-mean-token-sum":
        return per_seq[has].mean()
    if mode == "seq-mean-token-mean":
        return (per_seq[has] / count[has]).mean()
    raise ValueError(mode)


def value_loss(v, batch, mode, c=CLIPRANGE):
    """vf_loss, vf_clipfrac, vpred_mean from values v [B,T] (differentiable in v)."""
    m = loss_tokens(batch)
    zero = torch.zeros((), dtype=v.dtype)
    # Ignored positions may hold anything: replace them before any arithmetic.
    v_old = torch.where(m, batch["values"].to(v.dtype), zero)
    ret = torch.where(m, batch["returns"].to(v.dtype), zero)
    v = torch.where(m, v, zero)
    v_clip = torch.minimum(torch.maximum(v, v_old - c), v_old + c)
    l1 = (v - ret).square()
    l2 = (v_clip - ret).square()
    return {
        "vf_loss": 0.5 * aggregate(torch.maximum(l1, l2), m, mode),
        "vf_clipfrac": aggregate((l2 > l1).to(v.dtype), m, "token-mean"),
        "vpred_mean": aggregate(v, m, "token-mean"),
    }


def value_loss_loop(v, batch, mode, c=CLIPRANGE):
    """The same three values over Python floats, one token at a time."""
    am, rm = batch["attention_mask"], batch["response_mask"]
    rows = []
    for b in range(B):
        row = []
        for t in range(1, T):
            if not (am[b, t] == 1 and am[b, t - 1] == 1 and rm[b, t] == 1):
                continue
            x = float(v[b, t])
            old, ret = float(batch["values"][b, t]), float(batch["returns"][b, t])
            x_clip = min(max(x, old - c), old + c)
            l1, l2 = (x - ret) ** 2, (x_clip - ret) ** 2
            row.append((max(l1, l2), 1.0 if l2 > l1 else 0.0, x))
        rows.append(row)
    tokens = [tok for row in rows for tok in row]
    seqs = [row for row in rows if row]
    if mode == "token-mean":
        loss = sum(tok[0] for tok in tokens) / len(tokens)
    elif mode == "seq-mean-token-sum":
        loss = sum(sum(tok[0] for tok in row) for row in seqs) / len(seqs)
    else:
        loss = sum(sum(tok[0] for tok in row) / len(row) for row in seqs) / len(seqs)
    return {"vf_loss": 0.5 * loss,
            "vf_clipfrac": sum(tok[1] for tok in tokens) / len(tokens),
            "vpred_mean": sum(tok[2] for tok in tokens) / len(tokens)}


def objective(params, cfg, batch, mode):
    return value_loss(critic_values(params, cfg, batch["input_ids"], batch["attention_mask"]),
                      batch, mode)


# ---------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------

def make_batch(cfg, params, values=critic_values):
    """The batch, with v_old and R placed around the values `values(params, cfg, ids, mask)`
    gives (make_critic_lora_fixtures.py passes its critic with adapters)."""
    gen = torch.Generator().manual_seed(31)
    ids = torch.randint(3, cfg["vocab_size"], (B, T), generator=gen)
    am = torch.zeros(B, T, dtype=torch.int64)
    rm = torch.zeros(B, T, dtype=torch.int64)
    for b, (first, n, (r0, r1), holes, extra) in enumerate(ROWS):
        am[b, first:first + n] = 1
        rm[b, r0:r1] = 1
        for h0, h1 in holes:
            rm[b, h0:h1] = 0
        for t in extra:
            rm[b, t] = 1
    batch = {"input_ids": ids, "attention_mask": am, "response_mask": rm}
    v = values(params, cfg, ids, am)
    m = loss_tokens(batch)
    old = torch.zeros(B, T, dtype=F64)
    ret = torch.zeros(B, T, dtype=F64)
    k, g = 0, 0
    for b in range(B):
        for t in range(T):
            if m[b, t]:
                _, d, e = KINDS[k % len(KINDS)]
                lap = k // len(KINDS)
                old[b, t] = v[b, t] - d * (1 + 0.05 * (lap % 3))
                ret[b, t] = v[b, t] + e * (1 + 0.1 * (lap % 4))
                k += 1
            else:  # ignored: garbage
                old[b, t] = GARBAGE[g % len(GARBAGE)]
                ret[b, t] = GARBAGE[(g + 1) % len(GARBAGE)]
                g += 1
    # As stored (float32): the reference reads these back.
    batch["values"] = old.to(torch.float32).to(F64)
    batch["returns"] = ret.to(torch.float32).to(F64)
    return batch, v


def check_margins_and_coverage(batch, v):
    """Every loss token keeps MARGIN from the clamp edges and from the l1 = l2 tie; every
    kind of token occurs at least twice (and so both sides clip)."""
    m = loss_tokens(batch)
    seen = {}
    for b, t in m.nonzero().tolist():
        x, old, ret = v[b, t].item(), batch["values"][b, t].item(), batch["returns"][b, t].item()
        d = x - old
        assert abs(abs(d) - CLIPRANGE) > MARGIN, (b, t, d)
        x_clip = min(max(x, old - CLIPRANGE), old + CLIPRANGE)
        if abs(d) < CLIPRANGE:
            kind = "inside"
        else:
            assert abs(ret - 0.5 * (x + x_clip)) > MARGIN, (b, t)
            kind = ("above" if d > 0 else "below") + (
                "_clipped" if (x_clip - ret) ** 2 > (x - ret) ** 2 else "_free")
        seen[kind] = seen.get(kind, 0) + 1
    assert set(seen) == {k for k, _, _ in KINDS} and min(seen.values()) >= 2, seen
    rows_with = int((m.sum(-1) > 0).sum())
    assert rows_with == B - 1 and m.sum(-1).tolist().count(1) == 1
    return (f"margins: every loss token >= {MARGIN} from the clamp edges and the tie; "
            f"kinds {dict(sorted(seen.items()))}")


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------

def finite_differences(params, cfg, batch, mode, grads, gen):
    """Central differences of vf_loss at 3 entries: max relative error vs autograd."""
    worst = 0.0
    for name in ("score.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"):
        p = params[name].view(-1)
        idx = int(torch.randint(p.numel(), (1,), generator=gen))
        h, saved = 1e-5, p[idx].item()
        p[idx] = saved + h
        up = objective(params, cfg, batch, mode)["vf_loss"].item()
        p[idx] = saved - h
        down = objective(params, cfg, batch, mode)["vf_loss"].item()
        p[idx] = saved
        fd = (up - down) / (2 * h)
        an = grads[name].view(-1)[idx].item()
        worst = max(worst, abs(fd - an) / max(abs(fd), abs(an), 1e-8))
    return worst


def rows_alone(params, cfg, batch):
    """values [B,T] with each row run alone, without its padding."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    out = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        real = am[b].nonzero()[:, 0]
        row = ids[b, real][None]
        out[b, real] = critic_values(params, cfg, row, torch.ones_like(row))[0]
    return out


def hf_values(model, batch, dtype):
    """values [B,T] from a transformers token-classification model, each row alone without
    its padding (eager attention turns fully masked padding queries into NaN)."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    out = torch.zeros(B, T, dtype=dtype)
    for b in range(B):
        real = am[b].nonzero()[:, 0]
        row = ids[b, real][None]
        r = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0, :, 0]
        out = out.index_put((torch.full((len(real) - 1,), b), real[1:]), r[:-1].to(dtype))
    return out


def load_hf(folder, dtype):
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging

    logging.disable_progress_bar()
    model, info = AutoModelForTokenClassification.from_pretrained(
        folder, dtype=dtype, attn_implementation="eager", output_loading_info=True)
    assert type(model).__name__ == "Qwen2ForTokenClassification", type(model)
    assert model.config.num_labels == 1, model.config.num_labels
    problems = ("missing_keys", "unexpected_keys", "mismatched_keys")
    assert not any(info.get(k) for k in problems), info
    model.eval()
    return model


def hf_state(model):
    return {n: p.detach() for n, p in model.state_dict().items()}


def check_transformers(params, batch, v, results, names):
    """transformers' Qwen2ForTokenClassification loads critic-untied with every weight and
    gives the same values in float64; in float32 its values and token-mean gradients show
    the error float32 arithmetic alone makes. Skipped where transformers is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return ["transformers not installed: its cross-checks skipped"]
    model = load_hf(CRITIC_DIR, F64)
    state = hf_state(model)
    assert all(torch.equal(state[n], params[n]) for n in names)
    with torch.no_grad():
        got = hf_values(model, batch, F64)
    worst = (got - v).abs().max().item()
    # transformers computes RoPE's inverse frequencies in float32 even in a float64 model.
    assert worst < 1e-5, worst
    lines = ["transformers AutoModelForTokenClassification loads critic-untied "
             f"(Qwen2ForTokenClassification, 1 label, every weight); f64 values max|d|={worst:.1e}"]

    model = load_hf(CRITIC_DIR, torch.float32)
    values32 = hf_values(model, batch, torch.float32)
    out = value_loss(values32, batch, "token-mean")
    out["vf_loss"].backward()
    grads = results["token-mean"][1]
    hf_names = dict(model.named_parameters())
    scaled = 0.0
    for n in names:
        g = grads[n]
        d = (hf_names[n].grad.to(F64) - g).abs().max().item()
        scaled = max(scaled, d / g.abs().max().item())
    dv = (values32.to(F64) - v).abs().max().item()
    dl = abs(out["vf_loss"].item() - results["token-mean"][0]["vf_loss"].item())
    lines.append(f"transformers in float32 vs float64: values max|d|={dv:.1e}, token-mean "
                 f"vf_loss |d|={dl:.1e}, grads max|d|/max|g| per tensor={scaled:.1e}")
    return lines


def native_executable():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = os.environ.get("SEARCHR1_NATIVE_DIR") or os.path.join(root, "native", "build")
    path = os.path.join(folder, "searchr1-trainer")
    return path if os.path.exists(path) else None


def serve(exe, commands):
    """Runs `searchr1-trainer serve` on the CPU with the commands; returns the replies."""
    text = "".join(json.dumps(dict(c, id=i)) + "\n" for i, c in enumerate(commands))
    r = subprocess.run([exe, "serve", "--device", "cpu", "--threads", "1"], input=text,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(replies) == len(commands) and all(x["ok"] for x in replies), replies
    return replies


def check_native(params, batch, v, names):
    """The native critic started from the causal LM folder (values all 0) and from
    critic-untied (the reference values): both checkpoints' dir/critic load with
    AutoModelForTokenClassification with the weights the native process held."""
    exe = native_executable()
    if exe is None:
        return ["native searchr1-trainer not built: its checks skipped (npm run build:native)"]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return ["transformers not installed: the native checkpoint checks skipped"]
    policy = os.path.join(mf.FIXTURES, MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        cmds = []
        for name, critic in (("lm", policy), ("critic", CRITIC_DIR)):
            cmds += [{"op": "load", "policy": policy, "critic": critic},
                     {"op": "values", "batch": BATCH_FILE, "out": os.path.join(tmp, name + ".v")},
                     {"op": "save_checkpoint", "dir": os.path.join(tmp, name)}]
        serve(exe, cmds)
        got = {n: mf.read_safetensors(os.path.join(tmp, n + ".v"))[0]["values"]
               for n in ("lm", "critic")}
        assert torch.count_nonzero(got["lm"]) == 0
        native_err = (got["critic"].to(F64) - v).abs().max().item()
        assert native_err < 1e-5, native_err
        with open(os.path.join(tmp, "lm", "critic", "config.json")) as f:
            written = json.load(f)
        assert written["architectures"] == ["Qwen2ForTokenClassification"], written

        lm, _ = mf.read_safetensors(os.path.join(policy, "model.safetensors"))
        model = load_hf(os.path.join(tmp, "lm", "critic"), F64)
        state = hf_state(model)
        assert set(state) == set(names), set(state) ^ set(names)
        trunk = [n for n in names if not n.startswith("score.")]
        assert all(torch.equal(state[n], lm[n].to(F64)) for n in trunk)
        assert all(torch.count_nonzero(state[n]) == 0 for n in ("score.weight", "score.bias"))
        with torch.no_grad():
            assert torch.count_nonzero(hf_values(model, batch, F64)) == 0

        model = load_hf(os.path.join(tmp, "critic", "critic"), F64)
        state = hf_state(model)
        assert all(torch.equal(state[n], params[n]) for n in names)
        with torch.no_grad():
            hf_err = (hf_values(model, batch, F64) - v).abs().max().item()
        assert hf_err < 1e-5, hf_err
    return ["native serve, critic = the causal LM folder: values all 0; its checkpoint's "
            "critic loads with AutoModelForTokenClassification (zero score, the LM's "
            "transformer weights bit-equal, values all 0)",
            f"native serve, critic = critic-untied: values max|d|={native_err:.1e}; its "
            f"checkpoint loads with transformers, same weights, values max|d|={hf_err:.1e}"]


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def sample_indices(params, batch, names, H):
    """Flat indices stored: SAMPLE_K per large tensor (half of the embedding's from rows of
    tokens in the batch, whose gradients are not zero)."""
    gen = torch.Generator().manual_seed(777)
    present = sorted(set(batch["input_ids"][batch["attention_mask"].bool()].tolist()))
    out = {}
    for name in names:
        n = params[name].numel()
        if n <= SAMPLE_K:
            out[name] = torch.arange(n)
            continue
        idx = torch.randperm(n, generator=gen)[:SAMPLE_K]
        if name == "model.embed_tokens.weight":
            live = torch.tensor([r * H + j for r in present for j in range(H)])
            idx = torch.cat((idx[: SAMPLE_K // 2],
                             live[torch.randperm(len(live), generator=gen)[: SAMPLE_K // 2]]))
            idx = torch.unique(idx)
        out[name] = idx.sort().values
    return out


def main():
    cfg, params = make_critic()
    names = [n for n, _ in critic_specs(cfg)]
    batch, v = make_batch(cfg, params)
    report = [check_margins_and_coverage(batch, v)]
    alone = (rows_alone(params, cfg, batch) - v).abs().max().item()
    assert alone < 1e-12, alone
    report.append(f"each row alone without its padding: same values (max|d|={alone:.1e})")

    results = {}
    gen = torch.Generator().manual_seed(5)
    fd_worst = 0.0
    m = loss_tokens(batch)
    for mode in MODES:
        leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        out = objective(leaves, cfg, batch, mode)
        out["vf_loss"].backward()
        values = {k: x.detach() for k, x in out.items()}
        grads = {n: leaves[n].grad.detach() for n in names}
        values["grad_norm"] = torch.sqrt(sum(g.square().sum() for g in grads.values()))
        results[mode] = (values, grads)
        loop = value_loss_loop(v, batch, mode)
        for k, x in loop.items():
            assert abs(x - values[k].item()) <= 1e-12 * max(1.0, abs(x)), (mode, k)
        clean = dict(batch)
        for k in ("values", "returns"):
            clean[k] = torch.where(m, batch[k], torch.zeros((), dtype=F64))
        leaves2 = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        out2 = objective(leaves2, cfg, clean, mode)
        out2["vf_loss"].backward()
        assert all(torch.equal(out2[k].detach(), values[k]) for k in out2), mode
        assert all(torch.equal(leaves2[n].grad, grads[n]) for n in names), mode
        assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in grads.values()), mode
        fd_worst = max(fd_worst, finite_differences(params, cfg, batch, mode, grads, gen))
        print(f"== {mode:20s} vf_loss {values['vf_loss'].item():.9f}  clipfrac "
              f"{values['vf_clipfrac'].item():.4f}  vpred_mean {values['vpred_mean'].item():+.6f}"
              f"  grad_norm {values['grad_norm'].item():.6f}")
    assert fd_worst < 1e-6, fd_worst
    # The modes differ: token-mean and seq-mean-token-sum by the factor (loss tokens / rows
    # with one), seq-mean-token-mean in the gradient's direction too.
    for i, a in enumerate(MODES):
        for b in MODES[i + 1:]:
            (va, ga), (vb, gb) = results[a], results[b]
            assert abs(va["vf_loss"] - vb["vf_loss"]) > 1e-3 * abs(va["vf_loss"]), (a, b)
            w = "score.weight"
            turn = (ga[w] / ga[w].norm() - gb[w] / gb[w].norm()).norm().item()
            assert turn > 1e-2 or "seq-mean-token-mean" not in (a, b), (a, b, turn)
    report.append("per-token loop (python floats) = vectorised loss to 1e-12 in every mode")
    report.append("garbage at ignored positions: zeros there give bit-identical values and grads")
    report.append(f"finite differences (3 entries per mode, h=1e-5): max rel err={fd_worst:.1e}")

    # Write.
    os.makedirs(CRITIC_DIR, exist_ok=True)
    mf.write_json(os.path.join(CRITIC_DIR, "config.json"), critic_config(cfg))
    model_file = os.path.join(CRITIC_DIR, "model.safetensors")
    mf.write_safetensors(model_file, [(n, "F32", params[n]) for n in names], {"format": "pt"})
    batch_tensors = [("input_ids", "I64", batch["input_ids"]),
                     ("attention_mask", "I64", batch["attention_mask"]),
                     ("response_mask", "I64", batch["response_mask"]),
                     ("values", "F32", batch["values"]),
                     ("returns", "F32", batch["returns"])]
    mf.write_safetensors(BATCH_FILE, batch_tensors, {"critic": CRITIC})
    samples = sample_indices(params, batch, names, cfg["hidden_size"])
    clipped = int(round(results["token-mean"][0]["vf_clipfrac"].item() * int(m.sum())))
    case_tensors = [("ref.values", "F32", v),
                    ("loss_tokens", "I64", m.sum().reshape(1)),
                    ("clipped", "I64", torch.tensor([clipped]))]
    case_tensors += [("sample." + n, "I64", samples[n]) for n in names]
    for mode in MODES:
        values, grads = results[mode]
        for k in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm"):
            case_tensors.append((f"{mode}.{k}", "F32", values[k].reshape(1)))
        case_tensors.append((f"{mode}.grad_norms", "F32",
                             torch.stack([grads[n].norm() for n in names])))
        for n in names:
            case_tensors.append((f"{mode}.grad.{n}", "F32", grads[n].reshape(-1)[samples[n]]))
    mf.write_safetensors(CASES_FILE, case_tensors, {
        "critic": CRITIC,
        "batch": os.path.basename(BATCH_FILE),
        "cliprange_value": repr(CLIPRANGE),
        "modes": json.dumps(MODES),
        "params": json.dumps(names, separators=(",", ":")),
    })

    # Reload with the reader: bit-exact.
    got, _ = mf.read_safetensors(model_file)
    assert list(got) == names and all(torch.equal(got[n].to(F64), params[n]) for n in names)
    got, _ = mf.read_safetensors(BATCH_FILE)
    assert all(torch.equal(got[k], t.to(got[k].dtype)) for k, _, t in batch_tensors)
    got, meta = mf.read_safetensors(CASES_FILE)
    assert json.loads(meta["params"]) == names
    for k, dtype, t in case_tensors:
        want = t.to(torch.int64) if dtype == "I64" else t.to(torch.float32)
        assert torch.equal(got[k], want), k
    sizes = [os.path.getsize(p) for p in (model_file, BATCH_FILE, CASES_FILE)]
    report.append(f"reload: bit-exact ({' + '.join(map(str, sizes))} bytes)")
    report += check_transformers(params, batch, v, results, names)
    report += check_native(params, batch, v, names)
    for line in report:
        print("   check ok: " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
