"""Reference values for the advantage estimators in src/rl/, computed with PyTorch in float64.

Run from the repository root with any PyTorch (a venv's torch 2.x or Debian's python3-torch):

    python3 test/rl/make_fixtures.py

It rewrites test/rl/fixtures/advantages.json. The functions below are written from the
formulas (GRPO, Dr. GRPO, RLOO, GAE, REINFORCE++, the KL estimators k1/abs/k2/k3, verl's
fixed and adaptive KL controllers, masked whitening), vectorised over a padded [B, T] batch
as verl lays it out, not by translating the TypeScript. Their definitions:

  positions whose mask is 0 are not steps: GAE and REINFORCE++ carry the next step's value,
    advantage and return through them; every output is 0 there
  masked_whiten(x, m) = (x - mean) / sqrt(var + 1e-8), mean and unbiased var over all masked
    tokens of the batch, as verl's torch_functional: masked_mean = sum(x m) / (sum(m) + 1e-8),
    var = masked_mean((x - mean)^2) n / (n - 1)
  GRPO      A_i = (R_i - mean_g) / (std_g + 1e-6), std_g = torch.std (unbiased); a group of
            one has mean 0 and std 1; Dr. GRPO: A_i = R_i - mean_g
  RLOO      A_i = R_i - mean of the other members of the group; a group of one keeps R_i
  GAE       d_t = r_t + g V_{t+1} - V_t, A_t = d_t + g l A_{t+1}, returns = A + V, then A whitened
  REINFORCE++  G_t = r_t + g G_{t+1}, A = whiten(G)
  scores    the outcome score on the last position where the response mask is 1
  KL in reward  rewards = scores - beta * kl(old, ref) * loss_mask; current_kl = mean over rows
            (with a loss token) of each row's masked mean
  adaptive KL  beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon

Inputs are rounded to 4 decimals so the JSON stays small and readable; outputs keep full
float64 precision (Python's shortest round-trip repr). The file is then put in the
repository's JSON format with node_modules/.bin/biome (without it the script says so and
leaves compact JSON). The script checks its own results against closed forms and against
Search-R1's older GAE recursion, and fails loudly if one does not hold. Rerunning gives a
byte-identical file.
"""

import json
import os
import subprocess

import torch

torch.set_num_threads(1)
F64 = torch.float64
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "fixtures", "advantages.json")


# ---------------------------------------------------------------- formulas


def kl_estimate(logp, ref, kind):
    if kind == "kl":
        return logp - ref
    if kind == "abs":
        return (logp - ref).abs()
    if kind == "mse":
        return 0.5 * (logp - ref) ** 2
    if kind == "low_var_kl":
        d = torch.clamp(ref - logp, -20.0, 20.0)
        return torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
    raise ValueError(kind)


def masked_mean(x, m):
    return (x * m).sum() / (m.sum() + 1e-8)


def masked_whiten(x, m):
    n = m.sum()
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m) * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8) * m


def last_index(m):
    # position of the last 1 in each row
    T = m.shape[1]
    return T - 1 - torch.argmax(torch.flip(m, dims=[1]), dim=1)


def token_level_scores(scores, response_mask):
    out = torch.zeros_like(response_mask)
    out[torch.arange(len(scores)), last_index(response_mask)] = scores
    return out


def apply_kl(scores_t, old, ref, loss_mask, kind, beta):
    kld = kl_estimate(old, ref, kind) * loss_mask
    rewards = scores_t - beta * kld
    n = loss_mask.sum(dim=1)
    rows = n > 0
    per_row = (kld.sum(dim=1)[rows]) / n[rows]
    current = per_row.mean().item() if rows.any() else 0.0
    return rewards, current


def groups(uids):
    order = {}
    for i, u in enumerate(uids):
        order.setdefault(u, []).append(i)
    return list(order.values())


def grpo(rewards, m, uids, norm=True, eps=1e-6):
    R = (rewards * m).sum(dim=1)
    A = torch.zeros_like(R)
    for idx in groups(uids):
        g = R[idx]
        if len(idx) == 1:
            mean, std = torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)
        else:
            mean, std = g.mean(), torch.std(g)
        A[idx] = (g - mean) / (std + eps) if norm else g - mean
    return A.unsqueeze(1) * m


def rloo(rewards, m, uids):
    R = (rewards * m).sum(dim=1)
    A = R.clone()
    for idx in groups(uids):
        n = len(idx)
        if n > 1:
            g = R[idx]
            A[idx] = g * n / (n - 1) - g.mean() * n / (n - 1)
    return A.unsqueeze(1) * m


def gae(rewards, values, m, gamma, lam):
    B, T = rewards.shape
    next_v = torch.zeros(B, dtype=F64)
    next_a = torch.zeros(B, dtype=F64)
    adv = torch.zeros(B, T, dtype=F64)
    for t in reversed(range(T)):
        on = m[:, t] > 0
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_a
        next_v = torch.where(on, values[:, t], next_v)
        next_a = torch.where(on, a, next_a)
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
    returns = (adv + values) * m
    return masked_whiten(adv, m), returns, adv


def reinforce_pp(rewards, m, gamma):
    B, T = rewards.shape
    running = torch.zeros(B, dtype=F64)
    G = torch.zeros(B, T, dtype=F64)
    for t in reversed(range(T)):
        on = m[:, t] > 0
        running = torch.where(on, rewards[:, t] + gamma * running, running)
        G[:, t] = torch.where(on, running, torch.zeros_like(running))
    return masked_whiten(G, m), G


def adaptive_kl(value, target, horizon, steps):
    out = []
    for kl, n in steps:
        err = min(0.2, max(-0.2, kl / target - 1.0))
        value = value * (1.0 + err * n / horizon)
        out.append(value)
    return out


# ---------------------------------------------------------------- self-checks


def searchr1_gae(rewards, values_full, response_mask, gamma, lam):
    """Search-R1's fork: no mask in the recursion, V from the critic masked by the response
    attention mask shifted by one (so V at the first padding position is kept)."""
    B, T = rewards.shape
    shifted = torch.cat([torch.ones(B, 1, dtype=F64), response_mask[:, :-1]], dim=1)
    v = values_full * shifted
    last = torch.zeros(B, dtype=F64)
    adv = torch.zeros(B, T, dtype=F64)
    for t in reversed(range(T)):
        nv = v[:, t + 1] if t < T - 1 else torch.zeros(B, dtype=F64)
        last = rewards[:, t] + gamma * nv - v[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv


def check(cond, what):
    if not cond:
        raise SystemExit(f"self-check failed: {what}")


def close(a, b, tol=1e-10):
    return torch.allclose(a, b, rtol=tol, atol=tol)


# ---------------------------------------------------------------- inputs


GEN = torch.Generator().manual_seed(17)


def rnd(*shape, scale=1.0, shift=0.0):
    x = torch.randn(*shape, generator=GEN, dtype=F64) * scale + shift
    return torch.round(x * 1e4) / 1e4


def mask_from(lengths, T, holes=()):
    m = torch.zeros(len(lengths), T, dtype=F64)
    for b, n in enumerate(lengths):
        m[b, :n] = 1.0
    for b, lo, hi in holes:
        m[b, lo:hi] = 0.0
    return m


def with_garbage(x, m, value=7.25):
    # values at mask-0 positions must be ignored whatever they are
    return torch.where(m > 0, x, torch.full_like(x, value))


def L(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return x


# ---------------------------------------------------------------- cases


def kl_cases():
    d = [-25.0, -20.5, -3.0, -0.7, -0.1, 0.0, 0.1, 0.7, 2.0, 2.5, 3.0, 20.5, 25.0]
    logp = torch.tensor([-1.5 - 0.37 * i for i in range(len(d))], dtype=F64)
    ref = logp + torch.tensor(d, dtype=F64)
    out = {"logp": L(logp), "ref": L(ref)}
    for kind in ("kl", "abs", "mse", "low_var_kl"):
        out[kind] = L(kl_estimate(logp, ref, kind))
    k3 = torch.tensor(out["low_var_kl"], dtype=F64)
    check(bool((k3 >= 0).all()) and k3.max().item() == 10.0, "k3 is >= 0 and clamped at 10")
    return out


def controller_case():
    steps = [(0.05, 512), (0.1, 512), (0.3, 2560), (0.0, 64), (0.11, 512), (0.001, 5), (0.25, 100)]
    init, target, horizon = 0.2, 0.1, 10000
    values = adaptive_kl(init, target, horizon, steps)
    check(values[1] == values[0], "KL on target leaves beta unchanged")
    check(abs(values[2] / values[1] - (1 + 0.2 * 2560 / 10000)) < 1e-15, "error clipped at +0.2")
    return {
        "init_kl_coef": init,
        "target_kl": target,
        "horizon": horizon,
        "steps": [{"current_kl": k, "n_steps": n, "value_after": v} for (k, n), v in zip(steps, values)],
    }


def whiten_case():
    m = mask_from([6, 3, 5], 6, holes=[(0, 2, 4)])
    x = with_garbage(rnd(3, 6, scale=2.0, shift=0.5), m)
    w = masked_whiten(x, m)
    n = m.sum()
    mean = (w * m).sum() / n
    var = ((w - mean) ** 2 * m).sum() / (n - 1)
    # Mean 0 up to masked_mean's 1e-8, which shifts it by about mean(x) 1e-8 / n.
    check(abs(mean.item()) < 1e-8 and abs(var.item() - 1.0) < 1e-6, "whitened: mean 0, var 1")
    return {"values": L(x), "mask": L(m), "whitened": L(w)}


def grpo_cases():
    # 4 groups, rows not adjacent: a = 5 mixed, b = singleton, c = 3 all equal (std 0), d = 2
    uids = ["nq-train-3", "hotpotqa-train-3", "nq-train-3", "nq-train-9", "nq-train-3",
            "nq-train-9", "nq-train-3", "nq-train-9", "nq-train-3", "popqa-test-1", "popqa-test-1"]
    scores = torch.tensor([1.0, 0.8, 0.0, 1.0, 0.2, 1.0, 0.0, 1.0, 0.1, 0.0, 1.0], dtype=F64)
    lengths = [9, 4, 9, 6, 2, 9, 7, 5, 1, 8, 3]
    T = 9
    m = mask_from(lengths, T, holes=[(0, 2, 5), (6, 1, 3)])  # holes: tokens masked mid-response
    # a masked position never carries a reward: put the score at the last 1
    rewards = with_garbage(token_level_scores(scores, m), m, 5.0)
    out = []
    for norm in (True, False):
        A = grpo(rewards, m, uids, norm=norm)
        out.append({"name": "grpo" if norm else "dr_grpo", "norm_adv_by_std": norm,
                    "uids": uids, "token_level_rewards": L(rewards), "response_mask": L(m),
                    "advantages": L(A)})
    A = torch.tensor(out[0]["advantages"], dtype=F64)
    check(bool((A[[3, 5, 7]] == 0).all()), "all-equal group gets exactly 0")
    check(abs(A[1, 0].item() - 0.8 / (1 + 1e-6)) < 1e-15, "singleton gets R/(1+eps)")
    D = torch.tensor(out[1]["advantages"], dtype=F64)
    check(D[1, 0].item() == 0.8, "Dr. GRPO singleton keeps R")
    return out


def rloo_case():
    uids = ["a", "b", "a", "c", "a", "c", "a"]
    scores = torch.tensor([1.0, 0.5, 0.0, 0.3, 1.0, 0.9, 0.2], dtype=F64)
    m = mask_from([5, 3, 6, 6, 2, 4, 6], 6, holes=[(2, 1, 3)])
    rewards = token_level_scores(scores, m)
    A = rloo(rewards, m, uids)
    # leave-one-out identity for row 0: R_0 - mean(R_2, R_4, R_6)
    check(abs(A[0, 0].item() - (1.0 - (0.0 + 1.0 + 0.2) / 3)) < 1e-15, "RLOO leave-one-out")
    check(A[1, 0].item() == 0.5, "RLOO singleton keeps R")
    return {"uids": uids, "token_level_rewards": L(rewards), "response_mask": L(m), "advantages": L(A)}


def gae_cases():
    out = []
    B, T = 5, 8
    lengths = [8, 5, 8, 3, 6]
    for name, gamma, lam, holes in [
        ("gamma1_lam1", 1.0, 1.0, []),
        ("gamma099_lam095", 0.99, 0.95, []),
        ("gamma09_lam08_holes", 0.9, 0.8, [(0, 2, 4), (2, 1, 2), (4, 3, 5)]),
    ]:
        m = mask_from(lengths, T, holes=holes)
        rewards = with_garbage(rnd(B, T, scale=0.05), m, 3.0)
        rewards = rewards + token_level_scores(torch.tensor([1.0, 0.0, 0.2, 1.0, 0.1], dtype=F64), m)
        values = with_garbage(rnd(B, T, scale=0.3, shift=0.4), m, -5.0)
        A, R, raw = gae(rewards, values, m, gamma, lam)
        out.append({"name": name, "gamma": gamma, "lam": lam, "token_level_rewards": L(rewards),
                    "values": L(values), "mask": L(m), "advantages": L(A), "returns": L(R)})
        if not holes and gamma == 1.0 and lam == 1.0:
            # closed form: A_t = sum_{t' >= t} r_t' - V_t
            togo = torch.flip(torch.cumsum(torch.flip(rewards * m, [1]), 1), [1])
            check(close(raw, (togo - values) * m), "GAE(1,1) = reward-to-go - V")
        if not holes:
            # Search-R1's recursion over the padded width: equal at lam = 1, and otherwise
            # off only by gamma (1 - lam) V_pad on each trajectory's last token
            critic = values.clone()
            pad_v = torch.full((B,), 0.0, dtype=F64)
            for b, n in enumerate(lengths):
                if n < T:
                    critic[b, n] = 0.37 + 0.01 * b  # the critic's value at the first pad position
                    pad_v[b] = critic[b, n]
            old = searchr1_gae(rewards * m, critic, m, gamma, lam)
            mine = raw.clone()
            for b, n in enumerate(lengths):
                extra = gamma * (1 - lam) * pad_v[b]
                for t in range(n):
                    mine[b, t] += extra * (gamma * lam) ** (n - 1 - t)
            check(close(old * m, mine), f"Search-R1 GAE relation ({name})")
    return out


def reinforce_cases():
    out = []
    B, T = 4, 7
    for name, gamma, holes in [("gamma1", 1.0, []), ("gamma09_holes", 0.9, [(0, 1, 3), (3, 4, 6)])]:
        m = mask_from([7, 4, 6, 7], T, holes=holes)
        kl_part = with_garbage(rnd(B, T, scale=0.01), m, 2.0)
        rewards = kl_part + token_level_scores(torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=F64), m)
        A, G = reinforce_pp(rewards, m, gamma)
        out.append({"name": name, "gamma": gamma, "token_level_rewards": L(rewards), "mask": L(m),
                    "advantages": L(A), "returns": L(G)})
    return out


def pipeline_cases():
    """Search-R1-shaped steps: responses with retrieved blocks (response mask 1, loss mask 0),
    one ending on an observation, padding, interleaved groups and a singleton."""
    B, T = 8, 12
    lengths = [12, 9, 7, 12, 5, 10, 3, 11]
    uids = ["nq-train-0", "hotpotqa-train-0", "nq-train-0", "hotpotqa-train-0",
            "nq-train-0", "hotpotqa-train-0", "nq-train-0", "triviaqa-test-4"]
    scores = torch.tensor([1.0, 0.0, 0.2, 1.0, 0.1, 0.0, 1.0, 0.8], dtype=F64)
    response_mask = mask_from(lengths, T)
    # observations: rows 0, 2, 3, 5 have a retrieved block mid-response; row 7 ends on one
    loss_mask = mask_from(lengths, T, holes=[(0, 3, 6), (2, 2, 4), (3, 4, 9), (5, 1, 3), (7, 8, 11)])
    old = with_garbage(rnd(B, T, scale=0.8, shift=-1.2), response_mask, 0.5)
    ref = with_garbage(old + rnd(B, T, scale=0.3), response_mask, -9.0)
    values = with_garbage(rnd(B, T, scale=0.3, shift=0.3), response_mask, 4.0)
    common = {"uids": uids, "scores": L(scores), "response_mask": L(response_mask),
              "loss_mask": L(loss_mask), "old_log_probs": L(old), "ref_log_probs": L(ref),
              "values": L(values), "token_level_scores": L(token_level_scores(scores, response_mask))}
    runs = [
        ("grpo", "grpo", {"norm_adv_by_std_in_grpo": True}, None),
        ("dr_grpo", "grpo", {"norm_adv_by_std_in_grpo": False}, None),
        ("grpo_kl_low_var_kl", "grpo", {"norm_adv_by_std_in_grpo": True}, ("low_var_kl", 0.05)),
        ("rloo", "rloo", {}, None),
        ("reinforce_pp_kl", "reinforce_plus_plus", {"gamma": 0.99}, ("kl", 0.01)),
        ("ppo_searchr1", "gae", {"gamma": 1.0, "lam": 1.0}, ("kl", 0.001)),
        ("ppo_no_kl", "gae", {"gamma": 1.0, "lam": 1.0}, None),
    ]
    for kind in ("kl", "abs", "mse", "low_var_kl"):
        runs.append((f"ppo_gamma099_lam095_{kind}", "gae", {"gamma": 0.99, "lam": 0.95}, (kind, 0.1)))
    out = []
    for name, est, opts, kl in runs:
        s = token_level_scores(scores, response_mask)
        rewards, current = (s, None)
        if kl:
            rewards, current = apply_kl(s, old, ref, loss_mask, kl[0], kl[1])
        if est == "grpo":
            A = grpo(rewards, response_mask, uids, norm=opts["norm_adv_by_std_in_grpo"])
            R = A
        elif est == "rloo":
            A = rloo(rewards, response_mask, uids)
            R = A
        elif est == "gae":
            A, R, _ = gae(rewards, values, response_mask, opts["gamma"], opts["lam"])
        else:
            A, R = reinforce_pp(rewards, response_mask, opts["gamma"])
        # without KL the rewards are the scores; GRPO's and RLOO's returns are their advantages
        case = {"name": name, "estimator": est, **opts,
                "kl_in_reward": {"estimator": kl[0], "kl_coef": kl[1]} if kl else None}
        if kl:
            case["token_level_rewards"] = L(rewards)
        case["advantages"] = L(A)
        if R is not A:
            case["returns"] = L(R)
        if current is not None:
            case["current_kl"] = current
        out.append(case)
    s = torch.tensor(common["token_level_scores"], dtype=F64)
    check(s[7, 10].item() == 0.8 and loss_mask[7, 10].item() == 0.0,
          "score on the last response token even when it is an observation")
    return common, out


def main():
    common, pipelines = pipeline_cases()
    data = {
        "generator": "test/rl/make_fixtures.py",
        "kl": kl_cases(),
        "adaptive_kl_controller": controller_case(),
        "masked_whiten": whiten_case(),
        "grpo": grpo_cases(),
        "rloo": rloo_case(),
        "gae": gae_cases(),
        "reinforce_plus_plus": reinforce_cases(),
        "pipeline": {"batch": common, "cases": pipelines},
    }
    text = json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    biome = os.path.join(REPO, "node_modules", ".bin", "biome")
    if os.path.exists(biome):
        # Through stdin: biome.json leaves fixtures/ alone, a file named there is not formatted.
        r = subprocess.run(
            [biome, "format", "--stdin-file-path=advantages.json"],
            input=text,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        check(r.returncode == 0, "biome format: " + r.stdout + r.stderr)
        text = r.stdout
        note = "in biome's format"
    else:
        note = "compact: format it with biome (stdin, as above) before committing"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, REPO)} ({os.path.getsize(OUT)} bytes, {note})")


if __name__ == "__main__":
    main()
