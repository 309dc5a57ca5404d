// The bridge to `searchr1-trainer serve` with the real native binary and the tiny fixture
// models: batches written from response-aligned rows, outputs read back into rows, every op
// through TrainerProcess, and what happens when the trainer refuses a command or dies.
// One CPU thread and batches of a few short rows keep it quick.
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { chmod } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ServiceError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import { writeSafetensors } from "../../src/tensors/safetensors.js";
import { readResponseRows, type Sequence, writeBatch } from "../../src/trainer/batch.js";
import { TrainerProcess, type TrainerStartOptions } from "../../src/trainer/process.js";
import {
  logProbRows,
  updateActorRows,
  updateCriticRows,
  valueRows,
} from "../../src/trainer/rows.js";
import {
  CPU,
  get,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
  trainerOk,
} from "../native/helpers.js";

const POLICY = modelDir("untied");
const REFERENCE = modelDir("tied"); // another model with the same vocabulary (512)

const started: TrainerProcess[] = [];
afterAll(async () => {
  await Promise.all(started.map((t) => t.kill()));
});

async function start(options: Partial<TrainerStartOptions> = {}): Promise<TrainerProcess> {
  const t = await TrainerProcess.start({ device: "cpu", threads: 1, ...options });
  started.push(t);
  return t;
}

/** Rows of different prompt and response lengths (one response empty), seeded token ids. */
function sequences(seed: number, shape: [number, number][]): Sequence[] {
  const rng = new Rng(seed);
  const ids = (n: number) => Array.from({ length: n }, () => 3 + rng.int(509));
  return shape.map(([p, r]) => ({ promptIds: ids(p), responseIds: ids(r) }));
}
const SEQS = sequences(1, [
  [3, 6],
  [6, 2],
  [2, 9],
  [5, 0],
  [4, 5],
]);

/** `searchr1-trainer score` of `model` on `seqs` (batched by writeBatch), as rows. */
async function score(model: string, seqs: readonly Sequence[] = SEQS, temperature = 1) {
  const [batch, out] = [join(tempDir(), "batch.safetensors"), join(tempDir(), "score.safetensors")];
  await writeBatch(batch, seqs);
  trainerOk([
    ...["score", "--model", model, "--batch", batch, "--out", out],
    ...["--temperature", String(temperature), ...CPU, "--threads", "1"],
  ]);
  return readResponseRows(out, seqs, ["logprobs", "entropy"]);
}

/** score of one sequence alone, [1, P + R] without padding, built here by hand. */
async function scoreAlone(model: string, s: Sequence): Promise<Float32Array> {
  const [batch, out] = [join(tempDir(), "one.safetensors"), join(tempDir(), "score.safetensors")];
  const ids = BigInt64Array.from([...s.promptIds, ...s.responseIds], BigInt);
  await writeSafetensors(batch, [
    { name: "input_ids", dtype: "I64", shape: [1, ids.length], data: ids },
  ]);
  trainerOk(["score", "--model", model, "--batch", batch, "--out", out, ...CPU, "--threads", "1"]);
  const lp = get(await readFloats(out), "logprobs");
  return lp.slice(s.promptIds.length);
}

const bits = (rows: Float32Array[]) => rows.map((r) => [...new Uint32Array(r.slice().buffer)]);
const flat = (rows: ArrayLike<number>[]) => rows.flatMap((r) => [...Array.from(r)]);

describe("trainer bridge: log-probs", () => {
  it("logProbRows is score at the response positions, bit for bit, policy and reference", async () => {
    const t = await start();
    expect(await t.load({ policy: POLICY, reference: REFERENCE })).toMatchObject({
      parameters: 140160,
      device: "cpu",
    });
    const policy = await logProbRows(t, SEQS);
    const reference = await logProbRows(t, SEQS, { model: "reference", temperature: 0.7 });
    await t.shutdown();
    expect(policy.logProbs.map((r) => r.length)).toEqual([6, 2, 9, 0, 5]);
    for (const x of flat(policy.logProbs)) expect(x).toBeLessThan(0);

    const want = await score(POLICY);
    expect(bits(policy.logProbs)).toEqual(bits(want.logprobs));
    expect(bits(policy.entropy)).toEqual(bits(want.entropy));
    const wantRef = await score(REFERENCE, SEQS, 0.7);
    expect(bits(reference.logProbs)).toEqual(bits(wantRef.logprobs));
    expect(maxAbsDiff(flat(policy.logProbs), flat(reference.logProbs))).toBeGreaterThan(0.1);

    // Each sequence alone, unpadded, its response found by hand: the same numbers up to the
    // rounding of another batch shape (measured 3.8e-6 at most, CPU, one thread).
    for (const [i, s] of SEQS.entries()) {
      const alone = await scoreAlone(POLICY, s);
      expect(maxAbsDiff(policy.logProbs[i] as Float32Array, alone)).toBeLessThanOrEqual(1e-5);
    }
  });
});

/** Loss mask with an observation block (mask 0) in the middle of the longer responses. */
const LOSS_MASK = SEQS.map((s) =>
  s.responseIds.map((_, j) => (s.responseIds.length >= 5 && j >= 2 && j < 4 ? 0 : 1)),
);
const RESPONSE_MASK = SEQS.map((s) => s.responseIds.map(() => 1));
/** Rows 0 and 2 good (advantage +1), 1 and 4 bad (-1); row 3 has no response. */
const SIGN = [1, -1, 1, 1, -1];
const ADVANTAGES = SEQS.map((s, i) => s.responseIds.map(() => SIGN[i] as number));

/** Mean change of the log-probs over the loss tokens of the rows with advantage sign `sign`. */
function meanMove(before: Float32Array[], after: Float32Array[], sign: number): number {
  const moves: number[] = [];
  for (const [i, row] of before.entries()) {
    if (SIGN[i] !== sign) continue;
    for (const [j, x] of row.entries()) {
      if (LOSS_MASK[i]?.[j]) moves.push((after[i]?.[j] as number) - x);
    }
  }
  return moves.reduce((a, b) => a + b, 0) / moves.length;
}

describe("trainer bridge: updates and export", () => {
  it("updateActor raises the log-probs of positive-advantage tokens and lowers the others; export is what score loads", async () => {
    const t = await start();
    await t.load({ policy: POLICY, reference: REFERENCE, actor_optim: { lr: 1e-3 } });
    const old = await logProbRows(t, SEQS);
    const ref = await logProbRows(t, SEQS, { model: "reference" });
    const metrics = await updateActorRows(
      t,
      SEQS,
      {
        lossMask: LOSS_MASK,
        oldLogProbs: old.logProbs,
        advantages: ADVANTAGES,
        refLogProbs: ref.logProbs,
      },
      { kl_loss_coef: 0.001, entropy_coeff: 0.001, shuffle: false },
    );
    // The loss mask is what reached response_mask: `tokens` counts the generated tokens.
    expect(metrics).toMatchObject({
      tokens: flat(LOSS_MASK).filter((m) => m === 1).length,
      optimizer_steps: 1,
      micro_batches: 1,
      global_step: 1,
      pg_clipfrac: 0, // the first step's ratio is 1
      lr: Math.fround(1e-3),
    });
    for (const k of ["pg_loss", "ppo_kl", "entropy", "kl_loss", "grad_norm"] as const) {
      expect(typeof metrics[k], k).toBe("number");
    }
    expect(metrics.kl_loss).toBeGreaterThan(0); // policy and reference differ
    expect(Math.abs(metrics.ppo_kl as number)).toBeLessThan(1e-6);

    const after = await logProbRows(t, SEQS);
    // Measured +1.49 and -1.31: one AdamW step at lr 1e-3 is a big step for this tiny model.
    expect(meanMove(old.logProbs, after.logProbs, 1)).toBeGreaterThan(0.1);
    expect(meanMove(old.logProbs, after.logProbs, -1)).toBeLessThan(-0.1);

    const fp32 = join(tempDir(), "export-fp32");
    await t.exportPolicy({ out: fp32, dtype: "fp32" });
    const bf16 = join(tempDir(), "export-bf16");
    await t.exportPolicy({ out: bf16 });
    await t.shutdown();
    expect(readdirSync(fp32).sort()).toEqual(["config.json", "model.safetensors"]);
    expect(bits((await score(fp32)).logprobs)).toEqual(bits(after.logProbs));
    // bf16 weights: close to the fp32 policy (measured 0.025), far from the one before the
    // update (2.6).
    const rounded = (await score(bf16)).logprobs;
    expect(maxAbsDiff(flat(rounded), flat(after.logProbs))).toBeLessThan(0.1);
    expect(maxAbsDiff(flat(rounded), flat(old.logProbs))).toBeGreaterThan(1);
  });

  it("a critic loaded from the causal LM starts at zero; updateCritic moves its values toward the returns", async () => {
    const t = await start();
    await t.load({ policy: POLICY, critic: POLICY, critic_optim: { lr: 1e-2 } });
    const v0 = await valueRows(t, SEQS);
    expect(v0.map((r) => r.length)).toEqual([6, 2, 9, 0, 5]);
    expect(flat(v0).every((v) => v === 0)).toBe(true);

    const returns = SEQS.map((s, i) => s.responseIds.map((_, j) => 0.5 + 0.1 * i - 0.05 * j));
    const error = (v: Float32Array[]) => maxAbsDiff(flat(v), flat(returns));
    let values = v0;
    const losses: number[] = [];
    for (let step = 0; step < 4; step++) {
      const m = await updateCriticRows(
        t,
        SEQS,
        { responseMask: RESPONSE_MASK, values, returns },
        { cliprange_value: 10 },
      );
      expect(m).toMatchObject({ optimizer_steps: 1, global_step: step + 1, vf_clipfrac: 0 });
      losses.push(m.vf_loss as number);
      values = await valueRows(t, SEQS);
    }
    await t.shutdown();
    // 0.5 · mean((0 − R)²) over the response tokens at the start.
    const r2 = flat(returns).map((r) => r * r);
    expect(losses[0]).toBeCloseTo((0.5 * r2.reduce((a, b) => a + b, 0)) / r2.length, 6);
    expect(losses[3]).toBeLessThan((losses[0] as number) / 2);
    expect(error(values)).toBeLessThan(error(v0) / 2);
  });

  it("saveCheckpoint and loadCheckpoint resume bit-exactly", async () => {
    const load = { policy: POLICY, seed: 5, actor_optim: { lr: 1e-3, weight_decay: 0.1 } };
    const seqs = SEQS.slice(0, 4);
    const rows = { lossMask: LOSS_MASK.slice(0, 4), advantages: ADVANTAGES.slice(0, 4) };
    const batching = { ppo_mini_batch_size: 2, shuffle: true }; // 2 steps, rows shuffled
    const ckpt = join(tempDir(), "ckpt");

    const a = await start();
    await a.load(load);
    const old = (await logProbRows(a, seqs)).logProbs;
    await updateActorRows(a, seqs, { ...rows, oldLogProbs: old }, batching);
    expect(await a.saveCheckpoint({ dir: ckpt })).toEqual({ global_step: 2 });
    const second = await updateActorRows(a, seqs, { ...rows, oldLogProbs: old }, batching);
    const lpA = (await logProbRows(a, seqs)).logProbs;
    await a.shutdown();

    const b = await start();
    await b.load({ ...load, seed: 99 }); // the shuffling generator comes from the checkpoint
    expect(await b.loadCheckpoint({ dir: ckpt })).toEqual({ global_step: 2 });
    const resumed = await updateActorRows(b, seqs, { ...rows, oldLogProbs: old }, batching);
    const lpB = (await logProbRows(b, seqs)).logProbs;
    await b.shutdown();

    expect(second.global_step).toBe(4);
    expect(resumed).toStrictEqual(second);
    expect(bits(lpB)).toEqual(bits(lpA));
    expect(maxAbsDiff(flat(lpA), flat(old))).toBeGreaterThan(1e-3);
  });
});

describe("trainer bridge: refusals and deaths", () => {
  it("a refused command rejects with the trainer's message and the trainer goes on", async () => {
    const t = await start();
    await t.load({ policy: POLICY });
    const batch = t.scratch.file("inputs");
    await writeBatch(batch, SEQS);
    const out = t.scratch.file("out");
    const refusals: [Promise<unknown>, string][] = [
      [t.logProbs({ batch, out, model: "reference" }), "no reference model was loaded"],
      [t.updateActor({ batch }), `${batch}: tensor 'response_mask' is missing`],
      [t.values({ batch, out }), "no critic was loaded"],
      // A field the types do not know still goes to the trainer, which names it.
      [t.send("update_actor", { batch, kl_coef: 0.1 } as never), "unknown field 'kl_coef'"],
    ];
    const settled = await Promise.allSettled(refusals.map(([call]) => call));
    for (const [i, [, message]] of refusals.entries()) {
      const err = (settled[i] as PromiseRejectedResult).reason;
      expect(err).toBeInstanceOf(ServiceError);
      expect((err as Error).message).toMatch(
        /^the trainer refused (log_probs|update_actor|values): /,
      );
      expect((err as Error).message).toContain(message);
    }
    expect((await logProbRows(t, SEQS)).logProbs).toHaveLength(5);
    const scratch = t.scratch.path();
    await t.shutdown();
    expect(existsSync(scratch)).toBe(false);
    await expect(t.load({ policy: POLICY })).rejects.toThrow(
      "the trainer (searchr1-trainer serve) has been shut down",
    );
  });

  it("SIGKILL: pending and later calls reject with 'died' and the last stderr lines; onDeath is told", async () => {
    // A wrapper that writes to stderr, then becomes the trainer (same pid).
    const wrapper = join(tempDir(), "trainer.sh");
    writeFileSync(
      wrapper,
      `#!/bin/sh\necho "wrapper: starting" >&2\necho "wrapper: exec" >&2\nexec '${nativeExecutable("searchr1-trainer")}' "$@"\n`,
    );
    await chmod(wrapper, 0o755);
    const lines: string[] = [];
    const t = await start({ executable: wrapper, onLine: (l) => lines.push(l) });
    const deaths: Error[] = [];
    t.onDeath((e) => deaths.push(e));
    await t.load({ policy: POLICY });
    const scratch = t.scratch.path();

    // Stopped, it cannot answer: both calls are pending when it is killed.
    process.kill(t.pid as number, "SIGSTOP");
    const pending = [logProbRows(t, SEQS), t.exportPolicy({ out: join(tempDir(), "never") })];
    await new Promise((resolve) => setTimeout(resolve, 50));
    process.kill(t.pid as number, "SIGKILL");
    const message =
      "the trainer (searchr1-trainer serve) died (SIGKILL); its last lines:\n" +
      "  wrapper: starting\n  wrapper: exec";
    const settled = await Promise.allSettled(pending);
    for (const r of settled) {
      expect(r.status).toBe("rejected");
      expect((r as PromiseRejectedResult).reason).toBeInstanceOf(ServiceError);
      expect((r as PromiseRejectedResult).reason.message).toBe(message);
    }
    await expect(t.load({ policy: POLICY })).rejects.toThrow(message);
    expect(deaths.map((e) => e.message)).toEqual([message]);
    expect(lines).toEqual(["wrapper: starting", "wrapper: exec"]);
    expect(t.stderrTail()).toEqual(lines);
    await t.exited;
    expect(existsSync(scratch)).toBe(false);
    await t.shutdown(); // nothing left to stop: resolves
  });

  it("aborting the signal stops the trainer; that is not a death", async () => {
    const controller = new AbortController();
    const t = await start({ signal: controller.signal });
    const deaths: Error[] = [];
    t.onDeath((e) => deaths.push(e));
    await t.load({ policy: POLICY });
    controller.abort();
    await t.exited;
    await expect(logProbRows(t, SEQS)).rejects.toThrow(
      "the trainer (searchr1-trainer serve) was interrupted",
    );
    expect(deaths).toEqual([]);
  });
});

describe("trainer bridge: starting", () => {
  it("a trainer that exits at once (bad flags) fails the first call with its stderr", async () => {
    const t = await start({ threads: 0 });
    await expect(t.load({ policy: POLICY })).rejects.toThrow(
      /^the trainer \(searchr1-trainer serve\) died \(2\); its last lines:\n {2}.*threads/,
    );
  });

  it("an executable that cannot run rejects start", async () => {
    const missing = join(tempDir(), "no-trainer");
    await expect(start({ executable: missing })).rejects.toThrow(
      /^the trainer \(searchr1-trainer serve\) could not start: .*ENOENT/,
    );
  });
});
