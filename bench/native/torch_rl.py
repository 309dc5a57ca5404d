#!/usr/bin/env python3
"""The PyTorch side of `npm run bench:native -- --rl` (bench/native/rl.ts runs it; see there).

  torch_rl.py check
  torch_rl.py make --out DIR --vocab V --hidden H --intermediate I --layers L --heads NH
                   --kv-heads NKV [--tied] --batch B --seq T [--group N] [--seed S]
  torch_rl.py update --model DIR --data FILE --steps N --threads N --budget TOKENS
                     [--remove-padding] [--stdin] [--attention sdpa|eager] [--lr X]
                     [--weight-decay X] [--max-grad-norm X]

check   prints {"torch", "python", "blas"} as JSON (exit 3 when torch is missing); blas is
        the build's BLAS_INFO (mkl for pip's wheels) or the libblas.so it loaded (Debian's).
make    writes the random fp32 Qwen2 folder DIR/model (bench/native/torch_qwen2.py's `make`)
        and a GRPO-shaped rollout batch DIR/rl.safetensors, [B, T] each: input_ids (I64),
        attention_mask (I64), response_mask, old_log_probs, ref_log_probs, advantages (F32).
        Layout as verl's: B / N prompts with N samples each; the prompt in the first T/2
        columns, left-padded, the response in the last T/2, right-padded. Prompt lengths
        are uniform in [T/8, T/2] per prompt (the first prompt T/2); in each group half the
        responses are long (uniform in [3/8, 1/2] T) and half short ([1/16, 1/8] T), in a
        random order; the first prompt's first long response fills its T/2, so the longest
        sequence is T and the others are shorter, many much shorter. old_log_probs and
        ref_log_probs are the model's own log-probs of the batch plus Gaussian noise
        (sd 0.1 and 0.1), so ratios differ from 1 and both clip branches and the dual clip
        are taken; advantages are GRPO's (r - mean) / (std + 1e-6) of N(0, 1) rewards
        within each group, on the response tokens. Values off the loss tokens are 0.
        Prints {"params", "real_tokens", "loss_tokens", "lengths"}.
update  runs the actor update of `searchr1-trainer serve`'s update_actor, N times on the
        whole batch as one mini-batch (one optimizer step each): PPO's clipped surrogate
        (clip 0.2, dual clip 3 for negative advantages; log-ratio clamped to +-20 as verl
        does) plus 0.001 x low_var_kl against ref_log_probs (clamped to +-10), both
        token-means over the loss tokens (predicted and in the response mask) of the whole
        batch, gradients accumulated over micro-batches, clip at norm 1.0, AdamW. The
        micro-batches are consecutive rows while their real tokens fit in --budget (at
        least one row), as the trainer cuts them; with --remove-padding the rows are first
        sorted longest first (stable) and each micro-batch holds its rows' real tokens
        left-aligned, as wide as its longest row: the least padding PyTorch can compute on
        the CPU, where it has no packed attention (the trainer packs instead). Without it each micro-batch is [rows, T]
        as given (verl's use_remove_padding=False path). The model is Hugging Face's
        Qwen2ForCausalLM code in fp32 (torch_qwen2.py) on a padded batch: attention mask,
        position ids from the mask, full [b, w, V] logits, log-probs through
        F.cross_entropy(reduction="none"); SDPA attention by default (transformers' default;
        no varlen/flash kernel exists on CPU), --attention eager for Hugging Face's eager
        code. Prints one JSON line per update: {"step", "pg_loss", "kl_loss", "pg_clipfrac",
        "ppo_kl", "grad_norm", "tokens" (loss tokens), "real_tokens", "positions" (computed
        positions, padding included), "micro_batches", "seconds" (wall), "cpu_seconds" (the
        process's CPU time, all threads)}. With --stdin it prints {"ready": true} once the
        model is loaded, then waits for a line on stdin before each update (and stops at the end of stdin), so that rl.ts can interleave it with
        the trainer's updates.
"""

import argparse
import contextlib
import json
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_rl.py: the Python module 'torch' is missing "
          "(pip install torch, or Debian/Ubuntu: apt-get install -y python3-torch)",
          file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# torch_qwen2 imports test/native/make_fixtures.py, which pins torch to one thread:
# `update` sets the count afterwards.
import torch_qwen2  # noqa: E402
from torch_qwen2 import read_safetensors, write_safetensors  # noqa: E402

CLIP = 0.2
CLIP_C = 3.0
KL_COEF = 0.001


# ---------------------------------------------------------------------------
# The objective (verl's compute_policy_loss with dual clip, kl_penalty low_var_kl)
# ---------------------------------------------------------------------------

def policy_terms(logp, old, adv):
    """Per-token clipped surrogate and the clipped indicator."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - CLIP, 1.0 + CLIP)
    clipped = torch.maximum(loss1, loss2)
    dual = torch.minimum(-adv * CLIP_C, clipped)
    return torch.where(adv < 0, dual, clipped), loss2 > loss1


def low_var_kl(logp, ref):
    kl = ref - logp
    return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)


def token_log_probs(model, ids, mask):
    """[b, w] log-probs aligned as the trainer's: position t holds token t's (0 at t = 0)."""
    logits = model(ids, mask)  # [b, w, V]
    V = logits.shape[-1]
    lp = -F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1),
                          reduction="none").view(ids.shape[0], -1)
    return F.pad(lp, (1, 0))


def loss_tokens(mask, response_mask):
    """Predicted (it and the token before it real) and in the response mask."""
    m = mask.bool()
    pred = torch.zeros_like(m)
    pred[:, 1:] = m[:, 1:] & m[:, :-1]
    return pred & (response_mask != 0)


# ---------------------------------------------------------------------------
# check and make
# ---------------------------------------------------------------------------

def check(_args):
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    libs = sorted({line.split()[-1] for line in maps.splitlines() if "/libblas.so" in line})
    info = [w.split("=", 1)[1].rstrip(",") for w in torch.__config__.show().split()
            if w.startswith("BLAS_INFO=")]
    print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0],
                      "blas": " ".join(libs) or " ".join(info) or "unknown"}))


def make(args):
    with contextlib.redirect_stdout(sys.stderr):  # its {"params"} line; ours comes last
        torch_qwen2.make(args, rope_theta=10000.0, max_positions=args.seq,
                         torch_dtype="float32")
    B, T, N = args.batch, args.seq, args.group
    if B % N != 0 or T % 16 != 0:
        sys.exit("torch_rl.py make: --batch must be a multiple of --group, --seq of 16")
    P = T // 2  # prompt columns; the response gets the other T - P
    R = T - P
    gen = torch.Generator().manual_seed(args.seed + 1)

    def uniform(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    ids_src = read_safetensors(os.path.join(args.out, "data.safetensors"))[0]["input_ids"]
    ids = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    resp = torch.zeros(B, T)
    lengths = []
    for g in range(B // N):
        p = P if g == 0 else uniform(T // 8, P)
        long_first = [True] * (N // 2) + [False] * (N - N // 2)
        order = torch.randperm(N, generator=gen).tolist()
        for j in range(N):
            b = g * N + j
            is_long = long_first[order[j]]
            r = uniform(3 * T // 8, R) if is_long else uniform(T // 16, T // 8)
            if g == 0 and order[j] == 0:
                r = R
            mask[b, P - p:P + r] = 1
            resp[b, P:P + r] = 1
            ids[b] = ids_src[b] * mask[b]
            lengths.append(p + r)
    model, _ = torch_qwen2.load(os.path.join(args.out, "model"), sdpa=True)
    with torch.no_grad():
        logp = token_log_probs(model, ids, mask)
    lt = loss_tokens(mask, resp)
    real = mask.bool()
    old = torch.where(real, logp + 0.1 * torch.randn(B, T, generator=gen), 0.0)
    ref = torch.where(real, logp + 0.1 * torch.randn(B, T, generator=gen), 0.0)
    rewards = torch.randn(B // N, N, generator=gen)
    scores = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    adv = scores.reshape(B, 1) * resp
    write_safetensors(os.path.join(args.out, "rl.safetensors"), [
        ("input_ids", "I64", ids),
        ("attention_mask", "I64", mask),
        ("response_mask", "F32", resp),
        ("old_log_probs", "F32", old),
        ("ref_log_probs", "F32", ref),
        ("advantages", "F32", adv),
    ])
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()),
                      "real_tokens": int(mask.sum()), "loss_tokens": int(lt.sum()),
                      "lengths": lengths}))


# ---------------------------------------------------------------------------
# update
# ---------------------------------------------------------------------------

def micro_batches(mask, budget, remove_padding):
    """The trainer's cut by budget (native/src/train/minibatch.cpp), of rows sorted longest
    first with remove_padding: a list of (rows, compact)."""
    B = mask.shape[0]
    length = mask.sum(1).tolist()
    runs = ((mask[:, 1:] == 1) & (mask[:, :-1] == 0)).sum(1) + (mask[:, 0] == 1).long()
    contiguous = (runs <= 1).tolist()
    order = list(range(B))
    if remove_padding:
        order.sort(key=lambda b: -length[b])  # stable
    out, rows, tokens = [], [], 0
    for b in order:
        if budget > 0 and rows and tokens + length[b] > budget:
            out.append(rows)
            rows, tokens = [], 0
        rows.append(b)
        tokens += length[b]
    out.append(rows)
    return [(r, remove_padding and all(contiguous[b] for b in r)) for r in out]


def take(tensors, rows, compact, mask):
    """The micro-batch's rows of each [B, T] tensor, compacted (real tokens left-aligned,
    as wide as the longest row) when `compact`."""
    idx = torch.tensor(rows)
    if not compact:
        return [t[idx] for t in tensors]
    m = mask[idx].bool()
    width = int(m.sum(1).max())
    out = []
    for t in tensors:
        c = torch.zeros(len(rows), width, dtype=t.dtype)
        for i in range(len(rows)):
            real = t[idx[i]][m[i]]
            c[i, :real.numel()] = real
        out.append(c)
    return out


def update(args):
    # OpenMP (ATen) threads; rl.ts sets OMP_NUM_THREADS/MKL_NUM_THREADS to the same count.
    torch.set_num_threads(args.threads)
    if args.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"torch_rl.py: torch {torch.__version__} has no scaled_dot_product_attention: "
                 "use torch 2.x, or --attention eager")
    model, _ = torch_qwen2.load(args.model, sdpa=args.attention == "sdpa")
    d, _ = read_safetensors(args.data)
    ids, mask = d["input_ids"].long(), d["attention_mask"].long()
    per_token = [d["response_mask"], d["old_log_probs"], d["ref_log_probs"], d["advantages"]]
    total = int(loss_tokens(mask, d["response_mask"]).sum())  # token-mean's denominator
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)
    if args.stdin:
        print(json.dumps({"ready": True}), flush=True)
    for step in range(1, args.steps + 1):
        if args.stdin and not sys.stdin.readline():
            break
        start, cpu_start = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        pg_sum = kl_sum = ppo_kl_sum = 0.0
        clipped = positions = 0
        cuts = micro_batches(mask, args.budget, args.remove_padding)
        for rows, compact in cuts:
            mb_ids, mb_mask, resp, old, ref, adv = take([ids, mask] + per_token, rows, compact,
                                                        mask)
            positions += mb_ids.numel()
            lt = loss_tokens(mb_mask, resp)
            lp = token_log_probs(model, mb_ids, mb_mask)[lt]
            pg, was_clipped = policy_terms(lp, old[lt], adv[lt])
            kl = low_var_kl(lp, ref[lt])
            loss = (pg.sum() + KL_COEF * kl.sum()) / total
            loss.backward()
            pg_sum += float(pg.detach().sum())
            kl_sum += float(kl.detach().sum())
            ppo_kl_sum += float((old[lt] - lp.detach()).sum())
            clipped += int(was_clipped.sum())
        norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        print(json.dumps({"step": step, "pg_loss": pg_sum / total, "kl_loss": kl_sum / total,
                          "pg_clipfrac": clipped / total, "ppo_kl": ppo_kl_sum / total,
                          "grad_norm": norm.item(), "tokens": total,
                          "real_tokens": int(mask.sum()), "positions": positions,
                          "micro_batches": len(cuts), "seconds": seconds,
                          "cpu_seconds": cpu_seconds}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("check").set_defaults(fn=check)
    m = sub.add_parser("make")
    m.set_defaults(fn=make)
    m.add_argument("--out", required=True)
    for name in ("vocab", "hidden", "intermediate", "layers", "heads", "kv-heads", "batch",
                 "seq"):
        m.add_argument(f"--{name}", type=int, required=True)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--group", type=int, default=4)
    m.add_argument("--seed", type=int, default=0)
    u = sub.add_parser("update")
    u.set_defaults(fn=update)
    u.add_argument("--model", required=True)
    u.add_argument("--data", required=True)
    u.add_argument("--steps", type=int, required=True)
    u.add_argument("--threads", type=int, required=True)
    u.add_argument("--budget", type=int, required=True)
    u.add_argument("--remove-padding", action="store_true")
    u.add_argument("--stdin", action="store_true")
    u.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    u.add_argument("--lr", type=float, default=1e-6)
    u.add_argument("--weight-decay", type=float, default=0.01)
    u.add_argument("--max-grad-norm", type=float, default=1.0)
    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
