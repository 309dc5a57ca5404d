// One KL rule on both sides: the native trainer's estimators (kl_penalty in
// native/src/train/ppo_loss.cpp, reached through searchr1-kl-check) against src/rl/kl.ts, on
// the same log-probs: log-ratios of ±30, ±20.5, ±20, ±11, ±3, ±1e-8 and 0, equal values,
// infinite and NaN log-probs, and a seeded sweep. Both follow verl's kl_penalty_forward
// (verl/trainer/ppo/core_algos.py); test/rl/advantages.test.ts checks the TypeScript one
// against PyTorch.
//
// Tolerance. Both sides compute in double from float32 log-probs (the trainer's tensors are
// float32; it widens them before the estimate), so the inputs here are float32 values, which
// reach the C++ exactly (shortest round-trip text, read by strtod). Both apply the same
// operations in the same order, and -, *, |.| are correctly rounded IEEE operations: k1, abs
// and k2 must agree bit for bit. exp is the one operation no standard pins down (V8's
// fdlibm-derived exp and glibc's are each within 1 ulp), so k3 = exp(k) - k - 1 may differ by
// the ulps of exp(k) that the two subtractions carry: allowed 4 ε (exp(k) + |k| + 1)
// (measured over 200 000 random pairs, log-ratios of scale 5: 2.7% differ, by at most 0.74 ε
// (exp(k) + |k| + 1)). verl computes in the log-probs' float32, ~1e-7 relative away: the two
// sides here are far closer to each other than either is to that. dlogp, which only the
// trainer computes, is checked against one-sided differences of the TypeScript value: it
// must lie between them (a kink's subgradient included), within their truncation error.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { KL_ESTIMATORS, type KlEstimator, klPenalty } from "../../src/rl/kl.js";
import { nativeDir } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";

const f32 = Math.fround;
const EPS = Number.EPSILON;

/** (logp, ref) pairs of float32 values. */
function inputs(): [number, number][] {
  const pairs: [number, number][] = [];
  const ratios = [30, 20.5, 20, 11, 3, 0.7, 1e-8, 0];
  for (const base of [-0.5, -7.25, -45]) {
    for (const d of ratios.flatMap((r) => [r, -r])) pairs.push([base, f32(base - d)]);
  }
  const tiny = f32(1e-8);
  const small = f32(2e-8);
  pairs.push([-tiny, 0], [0, -tiny], [-tiny, -small], [-small, -tiny]); // log-ratios of ±1e-8
  for (const v of [0, -tiny, -1.5, -30]) pairs.push([v, v]); // equal values
  const inf = Number.POSITIVE_INFINITY;
  pairs.push([-inf, -1], [-1, -inf], [-inf, -inf], [Number.NaN, -1], [-1, Number.NaN]);
  const rng = new Rng(29);
  for (const scale of [1e-6, 0.01, 0.3, 1, 3, 12]) {
    for (let i = 0; i < 100; i++) {
      const logp = f32(-20 * rng.uniform());
      pairs.push([logp, f32(Math.min(0, logp + scale * rng.normal()))]);
    }
  }
  return pairs;
}

/** A double as text strtod reads back exactly (String(-0) would lose the sign). */
const text = (x: number): string => (Object.is(x, -0) ? "-0" : String(x));

/** %.17g's text back to a number: inf, -inf, nan, -nan included. */
function number(s: string): number {
  if (/^-?nan$/i.test(s)) return Number.NaN;
  if (/^inf$/i.test(s)) return Number.POSITIVE_INFINITY;
  if (/^-inf$/i.test(s)) return Number.NEGATIVE_INFINITY;
  const x = Number(s);
  if (Number.isNaN(x)) throw new Error(`searchr1-kl-check wrote ${s}`);
  return x;
}

interface Row {
  kind: KlEstimator;
  logp: number;
  ref: number;
  value: number;
  dlogp: number;
}

/** The native estimates of every (estimator, pair). */
function native(pairs: [number, number][]): Row[] {
  const exe = join(nativeDir(), "searchr1-kl-check");
  if (!existsSync(exe)) throw new Error(`${exe} is not built: run npm run build:native`);
  const queries = KL_ESTIMATORS.flatMap((kind) =>
    pairs.map(([logp, ref]) => ({ kind, logp, ref })),
  );
  const r = spawnSync(exe, [], {
    input: queries.map((q) => `${q.kind} ${text(q.logp)} ${text(q.ref)}\n`).join(""),
    encoding: "utf8",
    timeout: 30_000,
  });
  if (r.status !== 0) throw new Error(`searchr1-kl-check exited ${r.status}: ${r.stderr}`);
  const lines = r.stdout.trimEnd().split("\n");
  expect(lines.length).toBe(queries.length);
  return queries.map((q, i) => {
    const [value = "", dlogp = ""] = (lines[i] ?? "").split(" ");
    return { ...q, value: number(value), dlogp: number(dlogp) };
  });
}

const same = (a: number, b: number): boolean => a === b || (Number.isNaN(a) && Number.isNaN(b));

/** The largest |native - TypeScript| allowed (see the opening comment). */
function allowed(kind: KlEstimator, logp: number, ref: number): number {
  if (kind !== "low_var_kl") return 0;
  const k = Math.min(20, Math.max(-20, ref - logp));
  return 4 * EPS * (Math.exp(k) + Math.abs(k) + 1);
}

const rows = native(inputs());
const where = (r: Row) => `${r.kind}(logp ${r.logp}, ref ${r.ref})`;

describe("the KL estimators: native trainer and TypeScript", () => {
  for (const kind of KL_ESTIMATORS) {
    it(`${kind}: the same value on every input, extreme and non-finite included`, () => {
      const mine = rows.filter((r) => r.kind === kind);
      const off = mine
        .map((r) => ({ r, ts: klPenalty(r.logp, r.ref, kind) }))
        .filter(({ r, ts }) => {
          if (Number.isNaN(ts) || Number.isNaN(r.value) || !Number.isFinite(ts)) {
            return !same(r.value, ts);
          }
          return !(Math.abs(r.value - ts) <= allowed(kind, r.logp, r.ref));
        })
        .map(({ r, ts }) => `${where(r)}: native ${r.value}, TypeScript ${ts}`);
      expect(off).toEqual([]);
    });

    it(`${kind}: the native derivative is that of the TypeScript value`, () => {
      const h = 2 ** -20;
      const off = rows
        .filter((r) => r.kind === kind && Number.isFinite(r.logp) && Number.isFinite(r.ref))
        .filter((r) => {
          const f = (x: number) => klPenalty(x, r.ref, kind);
          const [below, at, above] = [f(r.logp - h), f(r.logp), f(r.logp + h)];
          const [left, right] = [(at - below) / h, (above - at) / h];
          // truncation (h/2 · f'', f'' at most e^2.61 where k3 is not flat) and rounding
          const tol = 8 * h + (4 * EPS * (1 + Math.abs(at))) / h;
          return !(
            r.dlogp >= Math.min(left, right) - tol && r.dlogp <= Math.max(left, right) + tol
          );
        })
        .map((r) => `${where(r)}: native dlogp ${r.dlogp}`);
      expect(off).toEqual([]);
    });
  }

  it("k3 is 10 with no gradient, not NaN, when a log-prob is -Infinity", () => {
    const inf = rows.filter(
      (r) => r.kind === "low_var_kl" && [r.logp, r.ref].includes(Number.NEGATIVE_INFINITY),
    );
    const one = inf.filter((r) => Number.isFinite(r.logp) || Number.isFinite(r.ref));
    expect(one.map((r) => [r.value, r.dlogp])).toEqual([
      [10, 0],
      [10, 0],
    ]);
  });
});
