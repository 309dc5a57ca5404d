// What the critic's tests share (critic.test.ts, critic-lora.test.ts): `serve` run on the
// CPU with a list of commands, the tolerance check, and gradients recovered from one AdamW
// step. serve exposes gradients only through AdamW, so the critic's optimizer takes one
// step with a huge eps E (and no decay, clipping or schedule): with the bias-corrected
// moments m̂ = g, v̂ = g², each weight moves by d = -L·g/(|g| + E), from which the test
// recovers g = -sign(d)·|d|·E/(L - |d|) exactly (d read from save_checkpoint's fp32 files).
// L/E = 100 makes d a hundred times g, so the fp32 rounding of the weights costs at most
// ~1e-9 of g.
import { spawnSync } from "node:child_process";
import { expect } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { CPU } from "./helpers.js";

export const LR = 1e6; // L
export const EPS = 1e4; // E
/** The critic optimizer whose first step gives the gradient back (above). */
export const OPTIM = { lr: LR, eps: EPS, weight_decay: 0, grad_clip: 0, beta1: 0.9, beta2: 0.999 };

export type Reply = Record<string, unknown> & { id: number; ok: boolean; error?: string };

/** Runs `serve` on the CPU with the commands (ids 0, 1, ...); fails unless all succeed. */
export function serve(commands: Record<string, unknown>[]): Reply[] {
  const replies = serveReplies(commands);
  for (const x of replies) if (!x.ok) throw new Error(`serve: ${JSON.stringify(x)}`);
  return replies;
}

/** The same, returning every reply, refusals included. */
export function serveReplies(commands: Record<string, unknown>[]): Reply[] {
  const input = commands.map((c, id) => `${JSON.stringify({ ...c, id })}\n`).join("");
  const r = spawnSync(nativeExecutable("searchr1-trainer"), ["serve", ...CPU, "--threads", "2"], {
    input,
    encoding: "utf8",
    timeout: 120_000,
    env: { ...process.env, OMP_NUM_THREADS: "2" },
  });
  if (r.status !== 0) throw new Error(`serve exited ${r.status}: ${r.stderr}`);
  const replies = r.stdout
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as Reply);
  expect(replies.map((x) => x.id)).toEqual(commands.map((_, id) => id));
  return replies;
}

/** The worst excess of |got - want| over rel*|want| + floor, as a fraction of floor (> 1 fails). */
export function excess(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  rel: number,
  floor: number,
) {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    const w = want[i] ?? Number.NaN;
    const ratio = (Math.abs((got[i] ?? Number.NaN) - w) - rel * Math.abs(w)) / floor;
    worst = Number.isNaN(ratio) ? Number.POSITIVE_INFINITY : Math.max(worst, ratio);
  }
  return worst;
}

/** A tensor's gradient from its values before and after one step of OPTIM (above). */
export function stepGradient(before: ArrayLike<number>, after: ArrayLike<number>): Float64Array {
  return Float64Array.from(before, (p, i) => {
    const d = (after[i] ?? Number.NaN) - p;
    return (-Math.sign(d) * Math.abs(d) * EPS) / (LR - Math.abs(d));
  });
}
