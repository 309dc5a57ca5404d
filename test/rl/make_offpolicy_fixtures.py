"""Reference values for rollout correction and DAPO's pieces in src/rl/, computed with PyTorch
(float64) and numpy from verl's code.

Run from the repository root with any PyTorch 2.x and numpy (e.g. /work/venv/bin/python):

    python3 test/rl/make_offpolicy_fixtures.py

It rewrites test/rl/fixtures/rollout-correction.json and test/rl/fixtures/dapo.json. The
functions below restate, over a padded [B, T] batch as verl lays it out, the code of
(volcengine/verl main, 2026-01):

  verl/trainer/ppo/rollout_corr_helper.py
    compute_rollout_correction_weights + compute_is_metrics   (IS weights, TIS, batch norm)
    compute_rollout_rejection_mask                             (RS; per-option mean/max/min
                                                                and masked fractions only)
    compute_offpolicy_metrics                                  (KL, PPL, chi2)
  verl/utils/torch_functional.py  masked_mean = sum / (mask.sum() + 1e-8)
  recipe/dapo/dapo_ray_trainer.py (before the move to verl-recipe)
    group filtering: keep a uid when np.std(metric values) > 0 or it has one trajectory
  verl/workers/reward_manager/dapo.py
    overlong_reward = min(-(len - (max_resp_len - buffer_len)) / buffer_len * factor, 0),
    which holds for len <= max_resp_len; beyond, DAPO's eq. 13 (-factor)

They are written from that code, not by translating the TypeScript. Inputs are rounded to
4 decimals; outputs keep full float64 precision (compact JSON: biome leaves fixtures alone).
Rerunning gives byte-identical files. The script checks a few closed forms and fails loudly
if one does not hold.
"""

import json
import math
import os

import numpy as np
import torch

torch.set_num_threads(1)
F64 = torch.float64
HERE = os.path.dirname(os.path.abspath(__file__))
SAFETY_BOUND = 20.0


def masked_sum(values, mask, axis=None):
    v = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (v * mask).sum() if axis is None else (v * mask).sum(axis)


def masked_mean(values, mask, axis=None):
    s = masked_sum(values, mask, axis)
    return s / (mask.sum() + 1e-8) if axis is None else s / (mask.sum(axis) + 1e-8)


# ------------------------------------------------------------------ rollout correction


def is_weights(log_ratio, mask, level, threshold, batch_normalize):
    if level == "token":
        log_ratio_for_metrics = log_ratio
        w = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_ratio_sum = masked_sum(log_ratio, mask, -1).unsqueeze(-1)
        log_ratio_for_metrics = log_ratio_sum
        w = torch.exp(torch.clamp(log_ratio_sum, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    w = w * mask
    metrics = is_metrics(w, log_ratio_for_metrics, mask, level, threshold)
    w = w.clamp(max=threshold)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(w, mask)
        else:
            seq_w = masked_mean(w, mask, -1)
            seq_mask = (mask.sum(-1) > 0).to(F64)
            mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            w = w / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return w, metrics


def is_metrics(w, log_ratio_for_metrics, mask, level, threshold):
    m = {}
    lower = 1.0 / threshold
    log_hi = math.log(threshold)
    log_lo = math.log(lower)
    if level == "sequence":
        m["rollout_is_max"] = math.exp(min(log_ratio_for_metrics.max().item(), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(log_ratio_for_metrics.min().item())
        m["rollout_is_mean"] = masked_mean(w, mask).item()
        m["rollout_is_ratio_fraction_high"] = (log_ratio_for_metrics > log_hi).to(F64).mean().item()
        m["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < log_lo).to(F64).mean().item()
    else:
        m["rollout_is_mean"] = masked_mean(w, mask).item()
        m["rollout_is_ratio_fraction_high"] = masked_mean((w > threshold).to(F64), mask).item()
        m["rollout_is_ratio_fraction_low"] = masked_mean((w < lower).to(F64), mask).item()
        mb = mask.bool()
        m["rollout_is_max"] = w.masked_fill(~mb, float("-inf")).max().item()
        m["rollout_is_min"] = w.masked_fill(~mb, float("inf")).min().item()
    if mask.sum() > 1:
        c = w.clamp(min=lower, max=threshold)
        mean_c = masked_mean(c, mask)
        var = masked_mean(c.square(), mask) - mean_c.square()
        m["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        m["rollout_is_std"] = 0.0
    c = w.clamp(min=lower, max=threshold)
    mean_c = masked_mean(c, mask)
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean((c / (mean_c + 1e-8)).square(), mask).item()
    seq = masked_mean(w, mask, -1)
    m["rollout_is_seq_mean"] = seq.mean().item()
    m["rollout_is_seq_std"] = seq.std().item() if seq.numel() > 1 else 0.0
    m["rollout_is_seq_max"] = seq.max().item()
    m["rollout_is_seq_min"] = seq.min().item()
    m["rollout_is_seq_max_deviation"] = (seq - 1.0).abs().max().item()
    m["rollout_is_seq_fraction_high"] = (seq > threshold).to(F64).mean().item()
    m["rollout_is_seq_fraction_low"] = (seq < lower).to(F64).mean().item()
    return m


def parse_thresholds(options, spec):
    raw = [str(spec)] if isinstance(spec, (int, float)) else [p.strip() for p in spec.split(",") if p.strip()]
    if len(raw) == 1 and len(options) > 1:
        raw = raw * len(options)
    out = {}
    for opt, s in zip(options, raw):
        if opt.endswith("k1"):
            lo, hi = s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s)
            out[opt] = (float(lo), float(hi))
        else:
            out[opt] = (None, float(s))
    return out


def rejection(log_ratio, mask, rs, spec):
    options = []
    for o in rs.split(","):
        o = o.strip()
        if o and o not in options:
            options.append(o)
    th = parse_thresholds(options, spec)
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    mb = mask.bool()
    seq_valid = mask.sum(-1) > 0
    combined = torch.ones_like(mask)
    m = {}
    for opt in options:
        lo, hi = th[opt]
        k = opt[-2:]
        tok = stats[k]
        if opt.startswith("token"):
            per_token = tok
        else:
            if opt.startswith("seq_sum"):
                seq = masked_sum(tok, mask, -1)
            elif opt.startswith("seq_mean"):
                seq = masked_mean(tok, mask, -1)
            else:
                mx = tok.masked_fill(~mb, float("-inf")).max(-1).values
                seq = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
            per_token = seq.unsqueeze(-1).expand_as(mask)
        if k == "k1":
            keep = (per_token >= math.log(lo)) & (per_token <= math.log(hi))
        else:
            keep = per_token <= hi
        keep_f = keep.to(F64)
        combined = combined * keep_f
        m[f"rollout_rs_{opt}_mean"] = masked_mean(per_token, mask).item()
        m[f"rollout_rs_{opt}_max"] = per_token.masked_fill(~mb, float("-inf")).max().item()
        m[f"rollout_rs_{opt}_min"] = per_token.masked_fill(~mb, float("inf")).min().item()
        m[f"rollout_rs_{opt}_masked_fraction"] = masked_mean(1 - keep_f, mask).item()
        seq_keep = (~((~keep) & mb)).all(-1)
        sv = seq_valid.to(F64)
        m[f"rollout_rs_{opt}_seq_masked_fraction"] = (
            (((1.0 - seq_keep.to(F64)) * sv).sum() / sv.sum()).item() if sv.sum() > 0 else 0.0
        )
    m["rollout_rs_masked_fraction"] = masked_mean(1 - combined, mask).item()
    final_keep = (combined > 0.5) & mb
    m["rollout_rs_seq_masked_fraction"] = (~final_keep & mb).any(-1).to(F64).mean().item()
    return mask * combined, m


def offpolicy(old, rollout, mask):
    m = {}
    mo = masked_mean(old, mask, -1)
    m["training_ppl"] = torch.exp(-mo).mean().item()
    m["training_log_ppl"] = (-mo).mean().item()
    m["kl"] = masked_mean(rollout - old, mask).item()
    lr = old - rollout
    m["k3_kl"] = masked_mean(torch.exp(lr) - lr - 1, mask).item()
    mr = masked_mean(rollout, mask, -1)
    m["rollout_ppl"] = torch.exp(-mr).mean().item()
    m["rollout_log_ppl"] = (-mr).mean().item()
    d = mr - mo
    m["log_ppl_diff"] = d.mean().item()
    m["log_ppl_abs_diff"] = d.abs().mean().item()
    m["log_ppl_diff_max"] = d.max().item()
    m["log_ppl_diff_min"] = d.min().item()
    m["ppl_ratio"] = torch.exp(d).mean().item()
    rho = torch.exp(torch.clamp(lr, -SAFETY_BOUND, SAFETY_BOUND))
    m["chi2_token"] = (masked_mean(rho.square(), mask) - 1.0).item()
    s = torch.clamp(masked_sum(lr, mask, -1), -SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = (torch.exp(2.0 * s).mean() - 1.0).item()
    return m


def correction(old, rollout, mask, case):
    log_ratio = old - rollout
    metrics = {}
    weights = None
    if case.get("rollout_is") is not None:
        weights, im = is_weights(
            log_ratio, mask, case["rollout_is"], case["rollout_is_threshold"], case.get("batch_normalize", False)
        )
        metrics.update(im)
    new_mask = mask.clone()
    if case.get("rollout_rs") is not None:
        new_mask, rm = rejection(log_ratio, mask, case["rollout_rs"], case["rollout_rs_threshold"])
        metrics.update(rm)
    metrics.update(offpolicy(old, rollout, mask))
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


# ------------------------------------------------------------------ DAPO


def filter_groups(uids, values):
    by_uid = {}
    for u, v in zip(uids, values):
        by_uid.setdefault(u, []).append(v)
    return [u for u, vs in by_uid.items() if np.std(vs) > 0 or len(vs) == 1]


def overlong(length, max_len, buffer_len, factor):
    if length <= max_len:  # verl's DAPORewardManager
        expected = max_len - buffer_len
        exceed = length - expected
        return min(-exceed / buffer_len * factor, 0)
    return -factor  # DAPO eq. 13 beyond L_max


# ------------------------------------------------------------------ inputs


def r4(x):
    return [[round(float(v), 4) for v in row] for row in x.tolist()]


def batch():
    g = torch.Generator().manual_seed(7)
    B, T = 6, 9
    mask = torch.zeros(B, T, dtype=F64)
    mask[0, :] = 1  # full row
    mask[1, :5] = 1  # short row
    mask[2, 1:7] = 1
    mask[2, 3:5] = 0  # a hole (retrieved tokens)
    mask[3, :] = 0  # no token at all
    mask[4, 2] = 1  # one token
    mask[5, :8] = 1
    old = -torch.rand(B, T, generator=g, dtype=F64) * 4 - 0.05
    # log-ratios from -1.2 to 1.2, plus a few far out (beyond the safety bound in a sum)
    gap = (torch.rand(B, T, generator=g, dtype=F64) - 0.5) * 2.4
    gap[0, 3] = 2.6
    gap[5, :] = gap[5, :].abs() * 6  # a row far off: its sum passes 20
    rollout = old - gap
    old = torch.tensor(r4(old), dtype=F64)
    rollout = torch.tensor(r4(rollout), dtype=F64)
    return old, rollout, mask


RC_CASES = [
    {"name": "token_is", "rollout_is": "token", "rollout_is_threshold": 2.0},
    {"name": "sequence_is", "rollout_is": "sequence", "rollout_is_threshold": 2.0},
    {"name": "token_is_norm", "rollout_is": "token", "rollout_is_threshold": 1.5, "batch_normalize": True},
    {"name": "sequence_is_norm", "rollout_is": "sequence", "rollout_is_threshold": 5.0, "batch_normalize": True},
    {"name": "metrics_only"},
    {"name": "rs_token_k1_scalar", "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
    {"name": "rs_two", "rollout_rs": "token_k1,seq_max_k3", "rollout_rs_threshold": "0.4_1.8,3.0"},
    {
        "name": "is_and_rs",
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.5_1.5",
    },
] + [
    {"name": f"rs_{opt}", "rollout_rs": opt, "rollout_rs_threshold": th}
    for opt, th in [
        ("token_k1", "0.5_1.5"),
        ("token_k2", 0.5),
        ("token_k3", 0.5),
        ("seq_sum_k1", "0.6_1.4"),
        ("seq_sum_k2", 2.5),
        ("seq_sum_k3", 2.5),
        ("seq_mean_k1", "0.5_1.5"),
        ("seq_mean_k2", 0.3),
        ("seq_mean_k3", 0.3),
        ("seq_max_k2", 1.0),
        ("seq_max_k3", 1.0),
    ]
]


def main():
    old, rollout, mask = batch()
    cases = []
    for case in RC_CASES:
        w, new_mask, metrics = correction(old, rollout, mask, case)
        cases.append(
            {
                **case,
                "weights": None if w is None else w.tolist(),
                "mask": new_mask.tolist(),
                "metrics": metrics,
            }
        )
    # closed forms
    lr = (old - rollout)[0]
    tok = [c for c in cases if c["name"] == "token_is"][0]
    for t in range(lr.numel()):
        want = min(math.exp(lr[t].item()), 2.0)
        assert abs(tok["weights"][0][t] - want) < 1e-15, (t, tok["weights"][0][t], want)
    assert all(v == 0 for v in tok["weights"][3]), "a row with no token has weight 0"
    seq = [c for c in cases if c["name"] == "sequence_is"][0]
    assert seq["metrics"]["rollout_corr/rollout_is_max"] == math.exp(20.0), "the row past the bound"
    for c in cases:
        for k in c["metrics"]:
            assert math.isfinite(c["metrics"][k]), (c["name"], k)
    masked = [c["metrics"].get("rollout_corr/rollout_rs_masked_fraction") for c in cases if "rollout_rs" in c]
    assert any(0 < m < 1 for m in masked if m is not None), masked
    rc = {
        "inputs": {"old": old.tolist(), "rollout": rollout.tolist(), "mask": mask.tolist()},
        "cases": cases,
    }

    groups = [
        {
            "name": "mixed",
            "uids": ["a", "a", "b", "b", "c", "c", "d", "d"],
            "values": [1, 0, 0, 0, 1, 1, 0, 1],
        },
        {"name": "singletons", "uids": ["a", "b", "c"], "values": [0, 1, 1]},
        {
            "name": "interleaved",
            "uids": ["x", "y", "x", "y", "z", "z", "x"],
            "values": [0.5, 0.2, 0.5, 0.3, 1.0, 1.0, 0.5],
        },
        {"name": "fractions", "uids": ["p", "p", "p", "q", "q", "q"], "values": [0.25, 0.25, 0.75, -0.5, -0.5, -0.5]},
        {"name": "all_dropped", "uids": ["a", "a", "b", "b"], "values": [0, 0, 1, 1]},
    ]
    for g in groups:
        g["kept"] = filter_groups(g["uids"], g["values"])
    assert groups[0]["kept"] == ["a", "d"] and groups[4]["kept"] == []
    overlongs = []
    for max_len, buf, factor in [(20, 4, 1.0), (500, 100, 0.5), (8, 8, 1.0), (16, 1, 2.0)]:
        lengths = list(range(0, max_len + 4))
        overlongs.append(
            {
                "max_len": max_len,
                "buffer_len": buf,
                "penalty_factor": factor,
                "lengths": lengths,
                "penalty": [overlong(n, max_len, buf, factor) for n in lengths],
            }
        )
    assert overlongs[0]["penalty"][16] == 0 and overlongs[0]["penalty"][18] == -0.5
    assert overlongs[0]["penalty"][20] == -1 and overlongs[0]["penalty"][23] == -1
    dapo = {"filter_groups": groups, "overlong": overlongs}

    for name, data in [("rollout-correction.json", rc), ("dapo.json", dapo)]:
        write(os.path.join(HERE, "fixtures", name), data)


def write(path, data):
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
