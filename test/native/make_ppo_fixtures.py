"""Generate PyTorch reference fixtures for `searchr1-trainer grad --loss ppo`.

Run from the repository root with PyTorch (written for what make_fixtures.py needs;
the committed files were made with torch 2.13 and transformers 5.18 in a venv). No
network is needed, nor transformers, which serves two extra checks where installed:

    python test/native/make_ppo_fixtures.py

It reads the tiny fp32 model test/native/fixtures/untied (written by make_fixtures.py,
whose model code, safetensors reader and writer it imports) and (re)writes:

  ppo.batch.safetensors   the batch the binary reads: input_ids, attention_mask,
                          response_mask (int64 [B,T]), old_log_probs, ref_log_probs,
                          advantages (float32 [B,T])
  ppo.cases.safetensors   for every case <c> (listed with its flags in
                          __metadata__["cases"], JSON): <c>.loss, <c>.pg_loss,
                          <c>.pg_clipfrac, <c>.kl_loss, <c>.entropy (float32 [1]),
                          <c>.logprobs (float32 [B,T] at the case's temperature, 0 where
                          not predicted, as grad writes them) and
                          <c>.grad.<hf name> for every parameter. Cases whose entry says
                          "grads": "full" hold whole gradients; the others hold the
                          entries at the flat indices sample.<hf name> (int64, shared by
                          those cases; small tensors are sampled whole) so that the file
                          stays small (every full case costs 560 kB).

The objective (verl's definitions, which the native code follows; b = row, t = position):
  logp[b,t]     = log_softmax(logits[b,t-1] / temperature)[input_ids[b,t]]
  entropy[b,t]  = entropy(softmax(logits[b,t-1] / temperature))
  predicted     = t >= 1 and attention_mask[b,t] == attention_mask[b,t-1] == 1
  loss token    = predicted and response_mask[b,t] == 1; old/ref/advantages at other
                  positions are ignored whatever they hold (this batch holds +-1e30,
                  +-3e38 and +-1e4 there, and response_mask is 1 at some positions that
                  are not predicted: position 0, padding, the first token after left
                  padding)
  ratio = exp(logp - old); pg1 = -A*ratio; pg2 = -A*clamp(ratio, 1-clip_low, 1+clip_high)
  clip_pg = max(pg1, pg2); pg = min(-A*clip_ratio_c, clip_pg) if A < 0 else clip_pg
  pg_clipfrac   = token-mean of (pg2 > pg1), whatever the aggregation
  kl            : logp - ref;  abs: |logp - ref|;  mse: 0.5*(logp - ref)^2
  low_var_kl    : d = ref - logp, clamp(exp(d) - d - 1, -10, 10)
  agg           : token-mean = sum over loss tokens / their count (whole batch);
                  seq-mean-token-sum / seq-mean-token-mean = mean over the rows with at
                  least one loss token of the row's sum / mean
  loss = agg(pg) - entropy_coeff*agg(entropy) + kl_loss_coef*agg(kl); gradients by
  autograd in float64 from the weights as stored. verl also clamps logp - old and
  ref - logp to [-20, 20] before exp; every value here stays well inside, so it does not
  matter.

The batch (6 rows x 24): a full row, right padding, left padding, a left-padded row with
no loss token at all, a row with exactly one loss token, a row of zero advantages (a GRPO
group whose rewards were all equal); masked spans in the middle of responses (retrieved
<information> tokens). old_log_probs = logp - r with log-ratios r chosen so that ratios
fall below 0.75, inside, in (1.2, 1.25), (1.25, 1.28), above 1.28 and above 3, with
advantages of both signs (dual clip fires for A < 0 and ratio > 3); ref_log_probs puts
ref - logp above 2.6 at a few tokens so that low_var_kl's clamp at 10 fires. No token lies
within MARGIN (in log space) of any clip boundary, the dual-clip point, the clamp or the
kink of |x|, at either temperature, so float32 rounding in the native code cannot move a
token across a branch.

Self checks (it fails loudly if one does not hold): files reload bit-exact; an
independent per-token loop over Python floats gives the same five values for every
case; central finite differences agree with autograd; garbage at ignored positions
changes nothing (replaced by zeros); every branch is exercised (coverage); the cases
differ from each other where their flags differ; transformers' Qwen2ForCausalLM (if
installed) gives the same log-probs. It also runs the whole objective with the model in
float32 and prints its error against float64, the scale the native tolerances are
chosen from. Output is deterministic: rerunning gives byte-identical files.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (sets torch to one thread: byte-identical reruns)

F64 = mf.F64
MODEL = "untied"
BATCH_FILE = os.path.join(mf.FIXTURES, "ppo.batch.safetensors")
CASES_FILE = os.path.join(mf.FIXTURES, "ppo.cases.safetensors")

B, T = 6, 24
# Per row: (first real position, number of real tokens, response span [start, end),
# masked spans inside the response, extra positions with response_mask = 1 that are not
# predicted, advantage kind).
ROWS = [
    (0, 24, (8, 24), [(13, 17)], [0], "token"),  # no padding
    (0, 19, (6, 19), [(10, 13)], [19, 20, 21, 22, 23], "group"),  # right padding
    (7, 17, (13, 24), [(17, 19)], [0, 1, 2, 3, 7], "token"),  # left padding
    (10, 14, (0, 0), [], [0, 10], "token"),  # left padding, no loss token
    (0, 10, (9, 10), [], [0], "group"),  # right padding, one loss token
    (2, 22, (9, 24), [(14, 16)], [], "zero"),  # left padding, all advantages 0
]
GROUP_ADV = {1: -0.8, 4: 1.3}  # GRPO-like constant advantages per row

# Log-ratios logp - old, cycled over the loss tokens (ratio 0.55 ... 6.0).
LOG_RATIOS = [-0.6, 0.05, 1.3, -0.35, 0.2, 0.55, -0.1, 0.235, 1.8, 0.9, -0.45, 0.12, 1.15]
TEMPERATURES = (1.0, 0.7)
MARGIN = 0.005  # minimum distance (log space) from every branch point
GARBAGE = [1e30, -1e30, 1e4, -1e4, 3e38, -3e38]

# CLI defaults as the issue gives them (verl's).
DEFAULTS = {
    "clip_ratio": 0.2,
    "clip_ratio_c": 3.0,
    "kl_loss_type": "low_var_kl",
    "kl_loss_coef": 0.0,
    "entropy_coeff": 0.0,
    "loss_agg_mode": "token-mean",
    "temperature": 1.0,
}

# name: (flags passed to the binary, grads stored "full" or "sampled", what it covers)
CASES = [
    ("search_r1", {"--kl-loss-type": "low_var_kl", "--kl-loss-coef": "0.001",
                   "--entropy-coeff": "0.001", "--clip-ratio": "0.2", "--clip-ratio-c": "3",
                   "--loss-agg-mode": "token-mean", "--temperature": "1"},
     "full", "Search-R1's settings: token-mean, low_var_kl 0.001, entropy 0.001, clip 0.2"),
    ("seq_sum_kl", {"--loss-agg-mode": "seq-mean-token-sum", "--kl-loss-type": "kl",
                    "--kl-loss-coef": "0.05", "--clip-ratio": "0.25"},
     "sampled", "seq-mean-token-sum, kl (k1), symmetric --clip-ratio 0.25"),
    ("seq_mean_mse_t07", {"--loss-agg-mode": "seq-mean-token-mean", "--kl-loss-type": "mse",
                          "--kl-loss-coef": "0.1", "--entropy-coeff": "0.01",
                          "--temperature": "0.7"},
     "full", "seq-mean-token-mean, mse (k2), entropy 0.01, temperature 0.7"),
    ("abs_kl", {"--kl-loss-type": "abs", "--kl-loss-coef": "0.1"},
     "sampled", "abs KL with coef 0.1, token-mean"),
    ("dual_clip_off", {"--kl-loss-type": "low_var_kl", "--kl-loss-coef": "0.001",
                       "--clip-ratio-c": "1e9"},
     "sampled", "dual clip off (clip_ratio_c 1e9); otherwise search_r1 without entropy"),
    ("asymmetric_clip", {"--clip-ratio-low": "0.2", "--clip-ratio-high": "0.28",
                         "--kl-loss-type": "low_var_kl", "--kl-loss-coef": "0.001"},
     "sampled", "clip_ratio_low 0.2, clip_ratio_high 0.28 (DAPO's clip-higher)"),
    ("entropy_no_kl", {"--entropy-coeff": "0.1", "--kl-loss-coef": "0",
                       "--kl-loss-type": "kl"},
     "sampled", "entropy 0.1 (0.01 moves the gradients by only 8e-4 of their scale), "
     "no KL term (coef 0; kl_loss still reported, as k1)"),
    ("defaults", {}, "sampled",
     "no flags: clip 0.2/0.2, clip_ratio_c 3, kl coef 0 (kl_loss as low_var_kl), "
     "entropy 0, token-mean, temperature 1"),
]
SAMPLE_K = 512  # sampled entries per parameter with more entries than this


def resolve(flags):
    """Hyperparameters of a case: its flags over the defaults (low/high default to
    --clip-ratio)."""
    hp = dict(DEFAULTS)
    for flag, value in flags.items():
        key = flag[2:].replace("-", "_")
        hp[key] = value if key in ("kl_loss_type", "loss_agg_mode") else float(value)
    hp.setdefault("clip_ratio_low", hp["clip_ratio"])
    hp.setdefault("clip_ratio_high", hp["clip_ratio"])
    return hp


# ---------------------------------------------------------------------------
# Model and per-token statistics
# ---------------------------------------------------------------------------

def load_model():
    mdir = os.path.join(mf.FIXTURES, MODEL)
    with open(os.path.join(mdir, "config.json")) as f:
        cfg = json.load(f)
    stored, _ = mf.read_safetensors(os.path.join(mdir, "model.safetensors"))
    params = {k: v.to(F64) for k, v in stored.items()}
    assert set(params) == {n for n, _, _ in mf.param_specs(cfg)}
    return cfg, params


def token_stats(params, cfg, ids, mask, temperature):
    """(logp, entropy) [B,T] at temperature, 0 where not predicted."""
    logits = mf.forward(params, cfg, ids, mask) / temperature
    logsm = logits[:, :-1].log_softmax(-1)
    lp = logsm.gather(-1, ids[:, 1:, None])[..., 0]
    ent = -(logsm.exp() * logsm).sum(-1)
    zero = torch.zeros(ids.shape[0], 1, dtype=logits.dtype)
    valid = mf.valid_mask(mask)
    return (torch.cat((zero, lp), 1).masked_fill(~valid, 0.0),
            torch.cat((zero, ent), 1).masked_fill(~valid, 0.0))


def loss_tokens(batch):
    return mf.valid_mask(batch["attention_mask"]) & (batch["response_mask"] == 1)


# ---------------------------------------------------------------------------
# The objective, vectorised (autograd) and as a plain per-token loop (self check)
# ---------------------------------------------------------------------------

def kl_term(kind, logp, ref):
    if kind == "kl":
        return logp - ref
    if kind == "abs":
        return (logp - ref).abs()
    if kind == "mse":
        return 0.5 * (logp - ref).square()
    if kind == "low_var_kl":
        d = ref - logp
        return (d.exp() - d - 1).clamp(-10.0, 10.0)
    raise ValueError(kind)


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


def objective(params, cfg, batch, hp):
    """The five outputs (float64 scalars, differentiable in params)."""
    logp, ent = token_stats(params, cfg, batch["input_ids"], batch["attention_mask"],
                            hp["temperature"])
    return objective_from_stats(logp, ent, batch, hp)


def objective_from_stats(logp, ent, batch, hp):
    """The five outputs from per-token logp and entropy [B,T], in their dtype."""
    m = loss_tokens(batch)
    zero = torch.zeros((), dtype=logp.dtype)
    # Ignored positions may hold anything: replace them before any arithmetic so that
    # not even a 0 * inf reaches the values or (through autograd) the gradients.
    old = torch.where(m, batch["old_log_probs"].to(logp.dtype), zero)
    ref = torch.where(m, batch["ref_log_probs"].to(logp.dtype), zero)
    adv = torch.where(m, batch["advantages"].to(logp.dtype), zero)
    logp = torch.where(m, logp, zero)
    ratio = (logp - old).exp()
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - hp["clip_ratio_low"], 1 + hp["clip_ratio_high"])
    clip_pg = torch.maximum(pg1, pg2)
    pg3 = -adv * hp["clip_ratio_c"]
    pg = torch.where(adv < 0, torch.minimum(pg3, clip_pg), clip_pg)
    mode = hp["loss_agg_mode"]
    out = {
        "pg_loss": aggregate(pg, m, mode),
        "pg_clipfrac": aggregate((pg2 > pg1).to(logp.dtype), m, "token-mean"),
        "kl_loss": aggregate(kl_term(hp["kl_loss_type"], logp, ref), m, mode),
        "entropy": aggregate(ent, m, mode),
    }
    out["loss"] = (out["pg_loss"] - hp["entropy_coeff"] * out["entropy"]
                   + hp["kl_loss_coef"] * out["kl_loss"])
    return out


def objective_loop(logp, ent, batch, hp):
    """The same five values written as verl's formulas over Python floats, one token at
    a time, from precomputed logp/entropy (an independent check of `objective`)."""
    ids, am, rm = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    lo, hi, c = 1 - hp["clip_ratio_low"], 1 + hp["clip_ratio_high"], hp["clip_ratio_c"]
    rows = []  # per row: list of (pg, clipped, kl, entropy)
    for b in range(ids.shape[0]):
        row = []
        for t in range(1, ids.shape[1]):
            if not (am[b, t] == 1 and am[b, t - 1] == 1 and rm[b, t] == 1):
                continue
            lp = float(logp[b, t])
            old, ref = float(batch["old_log_probs"][b, t]), float(batch["ref_log_probs"][b, t])
            a = float(batch["advantages"][b, t])
            r = math.exp(lp - old)
            p1, p2 = -a * r, -a * min(max(r, lo), hi)
            p = max(p1, p2)
            if a < 0:
                p = min(p, -a * c)
            kind = hp["kl_loss_type"]
            if kind == "kl":
                k = lp - ref
            elif kind == "abs":
                k = abs(lp - ref)
            elif kind == "mse":
                k = 0.5 * (lp - ref) ** 2
            else:
                d = ref - lp
                k = min(max(math.exp(d) - d - 1, -10.0), 10.0)
            row.append((p, 1.0 if p2 > p1 else 0.0, k, float(ent[b, t])))
        rows.append(row)

    def agg(i, mode):
        if mode == "token-mean":
            vals = [tok[i] for row in rows for tok in row]
            return sum(vals) / len(vals)
        seqs = [row for row in rows if row]
        if mode == "seq-mean-token-sum":
            return sum(sum(tok[i] for tok in row) for row in seqs) / len(seqs)
        return sum(sum(tok[i] for tok in row) / len(row) for row in seqs) / len(seqs)

    mode = hp["loss_agg_mode"]
    out = {"pg_loss": agg(0, mode), "pg_clipfrac": agg(1, "token-mean"),
           "kl_loss": agg(2, mode), "entropy": agg(3, mode)}
    out["loss"] = (out["pg_loss"] - hp["entropy_coeff"] * out["entropy"]
                   + hp["kl_loss_coef"] * out["kl_loss"])
    return out


# ---------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------

def boundaries():
    """Log-space points where some case's objective changes branch."""
    pts = {math.log(3.0)}
    for _, flags, _, _ in CASES:
        hp = resolve(flags)
        pts.add(math.log(1 - hp["clip_ratio_low"]))
        pts.add(math.log(1 + hp["clip_ratio_high"]))
        pts.add(math.log(hp["clip_ratio_c"]))
    return sorted(pts)


def _k3_root(y):
    """The d > 0 with exp(d) - d - 1 = y (Newton's method)."""
    d = 3.0
    for _ in range(50):
        d -= (math.exp(d) - d - 1 - y) / (math.exp(d) - 1)
    return d


D10 = _k3_root(10.0)  # 2.611...: low_var_kl's clamp at 10 (the only one it reaches: k3 >= 0)


def make_batch(cfg, params):
    gen = torch.Generator().manual_seed(4321)
    ids = torch.randint(3, cfg["vocab_size"], (B, T), dtype=torch.int64, generator=gen)
    am = torch.zeros(B, T, dtype=torch.int64)
    rm = torch.zeros(B, T, dtype=torch.int64)
    for b, (start, n, (r0, r1), holes, extra, _) in enumerate(ROWS):
        am[b, start:start + n] = 1
        rm[b, r0:r1] = 1
        for h0, h1 in holes:
            rm[b, h0:h1] = 0
        rm[b, extra] = 1
    ids = ids * am  # padding holds token 0
    batch = {"input_ids": ids, "attention_mask": am, "response_mask": rm}
    m = loss_tokens(batch)
    lps = {tt: token_stats(params, cfg, ids, am, tt)[0] for tt in TEMPERATURES}

    # Log-ratios and KL offsets per loss token, then nudged until no token is within
    # MARGIN of a branch point at either temperature.
    lr = torch.zeros(B, T, dtype=F64)
    dk = torch.zeros(B, T, dtype=F64)
    adv = torch.zeros(B, T, dtype=F64)
    toks = m.nonzero().tolist()
    kgen = torch.Generator().manual_seed(99)
    noise = torch.randn(len(toks), 2, dtype=F64, generator=kgen)
    for k, (b, t) in enumerate(toks):
        lr[b, t] = LOG_RATIOS[k % len(LOG_RATIOS)]
        dk[b, t] = 3.0 if k % 11 == 3 else 0.4 * noise[k, 0].item()
        kind = ROWS[b][5]
        if kind == "token":
            a = noise[k, 1].item()
            adv[b, t] = math.copysign(0.2 + abs(a), -1.0 if (k // 3) % 2 else 1.0)
        elif kind == "group":
            adv[b, t] = GROUP_ADV[b]
    pts = boundaries()
    for _ in range(100):
        moved = False
        for b, t in toks:
            for tt, lp in lps.items():
                shift = lp[b, t] - lps[1.0][b, t]  # log-ratio at tt = lr + shift
                x = lr[b, t] + shift
                if any(abs(x - p) < MARGIN for p in pts):
                    lr[b, t] += 3 * MARGIN
                    moved = True
                d = dk[b, t] - shift  # ref - logp at tt
                if abs(d) < MARGIN or abs(d - D10) < 10 * MARGIN:
                    dk[b, t] -= 20 * MARGIN
                    moved = True
        if not moved:
            break
    else:
        raise AssertionError("could not move every token off the branch points")

    f32 = lambda x: x.to(torch.float32)  # noqa: E731
    old = f32(lps[1.0] - lr)
    ref = f32(lps[1.0] + dk)
    adv = f32(adv)
    # Garbage at every ignored position.
    junk = torch.tensor([GARBAGE[i % len(GARBAGE)] for i in range(B * T)],
                        dtype=torch.float32).view(B, T)
    batch["old_log_probs"] = torch.where(m, old, junk)
    batch["ref_log_probs"] = torch.where(m, ref, junk.roll(1, 1))
    batch["advantages"] = torch.where(m, adv, -junk.roll(2, 1))
    return batch


# ---------------------------------------------------------------------------
# Self checks
# ---------------------------------------------------------------------------

def check_margins(batch, lps):
    """No loss token within MARGIN of a branch point, computed from the stored float32
    values exactly as the objective sees them."""
    m = loss_tokens(batch)
    pts = boundaries()
    worst = float("inf")
    for tt, lp in lps.items():
        x = (lp - batch["old_log_probs"].to(F64))[m]
        d = (batch["ref_log_probs"].to(F64) - lp)[m]
        dist = min(min((x - p).abs().min().item() for p in pts), d.abs().min().item())
        k3 = (d.exp() - d - 1 - 10).abs().min().item()
        assert dist >= MARGIN * 0.999 and k3 > 0.01, (tt, dist, k3)
        worst = min(worst, dist)
    return f"branch points: every loss token >= {worst:.4f} (log space) away"


def check_coverage(batch, lps):
    m = loss_tokens(batch)
    a = batch["advantages"].to(F64)[m]
    r = (lps[1.0] - batch["old_log_probs"].to(F64))[m].exp()
    d = (batch["ref_log_probs"].to(F64) - lps[1.0])[m]
    need = {
        "A>0, r<0.75": (a > 0) & (r < 0.75),
        "A>0, 0.8<r<1.2": (a > 0) & (r > 0.8) & (r < 1.2),
        "A>0, 1.2<r<1.25": (a > 0) & (r > 1.2) & (r < 1.25),
        "A>0, 1.25<r<1.28": (a > 0) & (r > 1.25) & (r < 1.28),
        "A>0, r>3": (a > 0) & (r > 3),
        "A<0, r<0.75": (a < 0) & (r < 0.75),
        "A<0, 1.28<r<3": (a < 0) & (r > 1.28) & (r < 3),
        "A<0, r>3 (dual clip)": (a < 0) & (r > 3),
        "A=0": a == 0,
        "low_var_kl clamped": d > D10,
        "ref < logp": d < 0,
    }
    missing = [k for k, v in need.items() if not v.any()]
    assert not missing, missing
    rm_ignored = ((batch["response_mask"] == 1) & ~m).sum().item()
    rows = m.sum(1).tolist()
    assert 0 in rows and 1 in rows and rm_ignored > 0, rows
    return (f"coverage: {int(m.sum())} loss tokens, per row {rows}; "
            + ", ".join(f"{k}: {int(v.sum())}" for k, v in need.items())
            + f"; response_mask=1 at {rm_ignored} unpredicted positions")


def finite_differences(params, cfg, batch, hp, grads, gen):
    """Central differences of the loss for three entries (lm_head, a q_proj weight, an
    embedding row of a token in the batch); returns the worst relative error."""
    rows = batch["input_ids"][batch["attention_mask"].bool()].tolist()
    H = cfg["hidden_size"]
    picks = [("lm_head.weight", int(torch.randint(0, params["lm_head.weight"].numel(), (1,),
                                                  generator=gen))),
             ("model.layers.0.self_attn.q_proj.weight",
              int(torch.randint(0, H * H, (1,), generator=gen))),
             ("model.embed_tokens.weight", rows[len(rows) // 2] * H + 7)]
    worst, h = 0.0, 1e-5
    for name, idx in picks:
        flat = params[name].view(-1)
        saved = flat[idx].item()
        flat[idx] = saved + h
        up = objective(params, cfg, batch, hp)["loss"].item()
        flat[idx] = saved - h
        down = objective(params, cfg, batch, hp)["loss"].item()
        flat[idx] = saved
        fd = (up - down) / (2 * h)
        an = grads[name].view(-1)[idx].item()
        worst = max(worst, abs(fd - an) / max(abs(fd), abs(an), 1e-8))
    return worst


def hf_stats(model, batch, temperature, dtype):
    """(logp, entropy) [B,T] from a transformers model, each row run alone without its
    padding (transformers' eager attention turns fully masked padding queries into NaN)."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    lp = torch.zeros(ids.shape, dtype=dtype)
    ent = torch.zeros(ids.shape, dtype=dtype)
    for b in range(ids.shape[0]):
        real = am[b].nonzero()[:, 0]
        row = ids[b, real][None]
        logits = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0]
        logsm = (logits[:-1].to(dtype) / temperature).log_softmax(-1)
        rows = torch.full((len(real) - 1,), b)
        lp = lp.index_put((rows, real[1:]), logsm.gather(-1, row[0, 1:, None])[:, 0])
        ent = ent.index_put((rows, real[1:]), -(logsm.exp() * logsm).sum(-1))
    return lp, ent


def check_transformers(batch, lps, results):
    """transformers' Qwen2ForCausalLM: in float64 it gives the same log-probs (rows alone,
    without padding) at both temperatures; in float32 its objective and gradients show
    the error float32 arithmetic alone makes, the scale the native tolerances are chosen
    from. Skipped where transformers is missing."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return ["transformers not installed: its cross-checks skipped"]
    mdir = os.path.join(mf.FIXTURES, MODEL)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=F64, attn_implementation="eager")
    model.eval()
    worst = 0.0
    with torch.no_grad():
        for tt, lp in lps.items():
            got, _ = hf_stats(model, batch, tt, F64)
            worst = max(worst, (got - lp).abs().max().item())
    # transformers computes RoPE's inverse frequencies in float32 even in a float64
    # model (about 1e-6 here); a real difference in the model would be of order 1.
    assert worst < 1e-5, worst
    lines = [f"transformers Qwen2ForCausalLM (f64) log-probs at T=1 and 0.7: max|d|={worst:.1e}"]

    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    val, scaled, beyond = 0.0, 0.0, 0.0
    for name, flags, _, _ in CASES:
        values, grads = results[name]
        hp = resolve(flags)
        model.zero_grad()
        lp, ent = hf_stats(model, batch, hp["temperature"], torch.float32)
        out = objective_from_stats(lp, ent, batch, hp)
        out["loss"].backward()
        for k in out:
            ref = values[k].item()
            val = max(val, abs(out[k].item() - ref) / max(abs(ref), 1e-6))
        for n, p in model.named_parameters():
            g = grads[n]
            d = (p.grad.to(F64) - g).abs()
            scale = g.abs().max().item()
            scaled = max(scaled, d.max().item() / scale)
            beyond = max(beyond, (d - 1e-4 * g.abs()).max().item() / scale)
    lines.append(f"transformers in float32 vs float64: values max rel err={val:.1e} "
                 f"(floor 1e-6); grads max |d|/max|g| per tensor={scaled:.1e}, "
                 f"excess over 1e-4 relative: {beyond:.1e} of max|g|")
    return lines


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def sample_indices(cfg, params, batch):
    """Flat indices stored for the sampled cases: SAMPLE_K per large tensor (half of the
    embedding's from rows of tokens in the batch, whose gradients are not zero)."""
    gen = torch.Generator().manual_seed(777)
    out = {}
    H = cfg["hidden_size"]
    present = sorted(set(batch["input_ids"][batch["attention_mask"].bool()].tolist()))
    for name, _, _ in mf.param_specs(cfg):
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
    cfg, params = load_model()
    batch = make_batch(cfg, params)
    lps = {tt: token_stats(params, cfg, batch["input_ids"], batch["attention_mask"], tt)[0]
           for tt in TEMPERATURES}
    report = [check_margins(batch, lps), check_coverage(batch, lps)]
    names = [n for n, _, _ in mf.param_specs(cfg)]
    samples = sample_indices(cfg, params, batch)

    results = {}
    gen = torch.Generator().manual_seed(5)
    fd_worst = 0.0
    for name, flags, grads_kind, _ in CASES:
        hp = resolve(flags)
        leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        out = objective(leaves, cfg, batch, hp)
        out["loss"].backward()
        values = {k: v.detach() for k, v in out.items()}
        grads = {n: leaves[n].grad.detach() for n in names}
        results[name] = (values, grads)

        # Per-token loop over Python floats agrees with the vectorised objective.
        lp, ent = token_stats(params, cfg, batch["input_ids"], batch["attention_mask"],
                              hp["temperature"])
        loop = objective_loop(lp, ent, batch, hp)
        for k, v in loop.items():
            assert abs(v - values[k].item()) <= 1e-12 * max(1.0, abs(v)), (name, k, v, values[k])
        # Garbage at ignored positions: zeros there give the same values and gradients.
        m = loss_tokens(batch)
        clean = dict(batch)
        for k in ("old_log_probs", "ref_log_probs", "advantages"):
            clean[k] = torch.where(m, batch[k], torch.zeros(()))
        leaves2 = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        out2 = objective(leaves2, cfg, clean, hp)
        out2["loss"].backward()
        assert all(torch.equal(out2[k].detach(), values[k]) for k in values), name
        assert all(torch.equal(leaves2[n].grad, grads[n]) for n in names), name
        assert all(torch.isfinite(g).all() for g in grads.values()), name
        fd_worst = max(fd_worst, finite_differences(params, cfg, batch, hp, grads, gen))
        print(f"== {name:17s} loss {values['loss'].item():+.9f}  pg {values['pg_loss'].item():+.6f}"
              f"  clipfrac {values['pg_clipfrac'].item():.4f}  kl {values['kl_loss'].item():.6f}"
              f"  entropy {values['entropy'].item():.6f}")
    assert fd_worst < 1e-6, fd_worst
    report.append("per-token loop (python floats) = vectorised objective to 1e-12 in every case")
    report.append("garbage at ignored positions: zeros there give bit-identical values and grads")
    report.append(f"finite differences (3 entries per case, h=1e-5): max rel err={fd_worst:.1e}")

    # Flags make a difference where they should.
    v = {n: r[0] for n, r in results.items()}
    g = {n: r[1] for n, r in results.items()}
    def differ(a, b, k):
        return abs(v[a][k].item() - v[b][k].item()) > 1e-3 * abs(v[a][k].item())

    assert differ("dual_clip_off", "asymmetric_clip", "pg_loss")
    assert differ("defaults", "dual_clip_off", "pg_loss")  # c = 3 vs 1e9
    assert differ("defaults", "asymmetric_clip", "pg_clipfrac")  # high 0.2 vs 0.28
    assert differ("defaults", "seq_sum_kl", "pg_clipfrac")  # --clip-ratio 0.25
    assert differ("defaults", "search_r1", "loss")
    assert torch.equal(v["defaults"]["pg_loss"], v["entropy_no_kl"]["pg_loss"])
    for a in ("dual_clip_off", "asymmetric_clip", "entropy_no_kl"):  # gradients too
        lm = "lm_head.weight"
        rel = (g[a][lm] - g["defaults"][lm]).abs().max() / g["defaults"][lm].abs().max()
        assert rel > 1e-3, (a, rel.item())
    kinds = {resolve(f)["kl_loss_type"] for _, f, _, _ in CASES}
    assert len({round(v[n]["kl_loss"].item(), 9) for n in v}) >= len(kinds)
    report.append("cases differ where their flags do (dual clip, clip ratios, KL, entropy)")
    report += check_transformers(batch, lps, results)

    # Write.
    batch_tensors = [("input_ids", "I64", batch["input_ids"]),
                     ("attention_mask", "I64", batch["attention_mask"]),
                     ("response_mask", "I64", batch["response_mask"]),
                     ("old_log_probs", "F32", batch["old_log_probs"]),
                     ("ref_log_probs", "F32", batch["ref_log_probs"]),
                     ("advantages", "F32", batch["advantages"])]
    mf.write_safetensors(BATCH_FILE, batch_tensors, {"model": MODEL})
    case_tensors = [("sample." + n, "I64", samples[n]) for n in names]
    meta_cases = []
    for name, flags, grads_kind, what in CASES:
        values, grads = results[name]
        for k in ("loss", "pg_loss", "pg_clipfrac", "kl_loss", "entropy"):
            case_tensors.append((f"{name}.{k}", "F32", values[k].reshape(1)))
        case_tensors.append((f"{name}.logprobs", "F32", lps[resolve(flags)["temperature"]]))
        for n in names:
            gt = grads[n] if grads_kind == "full" else grads[n].reshape(-1)[samples[n]]
            case_tensors.append((f"{name}.grad.{n}", "F32", gt))
        meta_cases.append({"name": name, "flags": flags, "grads": grads_kind,
                           "resolved": resolve(flags), "covers": what})
    mf.write_safetensors(CASES_FILE, case_tensors, {
        "model": MODEL,
        "batch": os.path.basename(BATCH_FILE),
        "cases": json.dumps(meta_cases, separators=(",", ":")),
    })

    # Reload with the reader: bit-exact.
    got, meta = mf.read_safetensors(BATCH_FILE)
    assert all(torch.equal(got[k], t.to(got[k].dtype)) for k, _, t in batch_tensors)
    got, meta = mf.read_safetensors(CASES_FILE)
    assert json.loads(meta["cases"]) == meta_cases
    for k, dtype, t in case_tensors:
        want = t.to(torch.int64) if dtype == "I64" else t.to(torch.float32)
        assert torch.equal(got[k], want), k
    sizes = [os.path.getsize(p) for p in (BATCH_FILE, CASES_FILE)]
    report.append(f"reload: bit-exact ({sizes[0]} + {sizes[1]} bytes)")
    for line in report:
        print("   check ok: " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
