// TrainerGroup: the data-parallel ranks of a run driven as one trainer (two CPU ranks over
// Gloo here), with the real native binary and the tiny fixture model. What the ranks compute
// is test/native/ranks.test.ts's; here, the controller's side: every op reaches every rank and
// returns rank 0's reply, refusals come back as one rank's, a rank that dies stops the group
// naming it, an abort stops every rank, and the rendezvous folder goes with them.
import { existsSync, readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { Rng } from "../../src/runtime/rng.js";
import type { Sequence } from "../../src/trainer/batch.js";
import { startTrainer, TrainerGroup, type TrainerGroupOptions } from "../../src/trainer/group.js";
import { TrainerProcess } from "../../src/trainer/process.js";
import { logProbRows } from "../../src/trainer/rows.js";
import { maxAbsDiff, modelDir, tempDir } from "../native/helpers.js";

const POLICY = modelDir("untied");

const started: { kill(): Promise<void> }[] = [];
afterAll(async () => {
  await Promise.all(started.map((t) => t.kill()));
});

async function group(options: Partial<TrainerGroupOptions> = {}): Promise<TrainerGroup> {
  const g = await TrainerGroup.start({ device: "cpu", threads: 2, ranks: 2, ...options });
  started.push(g);
  return g;
}

const rng = new Rng(3);
const ids = (n: number) => Array.from({ length: n }, () => 3 + rng.int(509));
const SEQS: Sequence[] = [
  [3, 6],
  [6, 2],
  [2, 9],
  [5, 0],
  [4, 5],
].map(([p, r]) => ({ promptIds: ids(p as number), responseIds: ids(r as number) }));
const flat = (rows: ArrayLike<number>[]) => rows.flatMap((r) => [...Array.from(r)]);

/** Whether a process is still there (signal 0 checks without sending). */
function alive(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("TrainerGroup", () => {
  it("sends every op to every rank and returns rank 0's reply; a refusal is one rank's", async () => {
    const g = await group();
    expect(g.size).toBe(2);
    expect(existsSync(g.rendezvous)).toBe(true);
    expect(await g.load({ policy: POLICY })).toMatchObject({ parameters: 140160, device: "cpu" });
    const two = await logProbRows(g, SEQS);
    await expect(g.logProbs({ batch: "/nonexistent/batch", out: tempDir() })).rejects.toThrow(
      /^the trainer's rank 0 refused log_probs: .*\/nonexistent\/batch/,
    );
    // The ranks go on serving after a refusal made before any collective.
    expect(flat((await logProbRows(g, SEQS)).logProbs)).toEqual(flat(two.logProbs));
    await g.shutdown();
    expect(existsSync(g.rendezvous)).toBe(false);

    const one = await TrainerProcess.start({ device: "cpu", threads: 1 });
    started.push(one);
    await one.load({ policy: POLICY });
    const want = await logProbRows(one, SEQS);
    await one.shutdown();
    // Each rank packs its own rows: the same numbers up to that packing's rounding.
    expect(maxAbsDiff(flat(two.logProbs), flat(want.logProbs))).toBeLessThan(1e-5);
  });

  it("a rank that dies stops the group: calls reject naming it, the other rank is stopped", async () => {
    const deaths: string[] = [];
    const g = await group();
    g.onDeath((err) => deaths.push(err.message));
    await g.load({ policy: POLICY });
    const [rank0, rank1] = g.pids;
    process.kill(rank1 as number, "SIGKILL");
    await g.exited;
    expect(deaths).toHaveLength(1);
    expect(deaths[0]).toMatch(/^the trainer's rank 1 \(searchr1-trainer serve\) died \(SIGKILL\)/);
    await expect(logProbRows(g, SEQS)).rejects.toThrow(/the trainer's rank 1 .* died/);
    expect(alive(rank0)).toBe(false);
    expect(existsSync(g.rendezvous)).toBe(false);
  });

  it("rank r sees only devices[r] (CUDA_VISIBLE_DEVICES); one trainer sees devices[0]", async () => {
    const visible = (pid: number | undefined) =>
      readFileSync(`/proc/${pid}/environ`, "utf8")
        .split("\0")
        .find((v) => v.startsWith("CUDA_VISIBLE_DEVICES="));
    // CPU ranks given devices: the environment is all this checks. The binary re-execs itself
    // once at start (native/src/cli/common.cpp, ensure_thread_policy), and /proc/PID/environ
    // reads empty mid-exec: a reply to an op says the process is past it.
    const g = await group({ devices: ["4", "GPU-5"] });
    await g.load({ policy: POLICY });
    expect(g.pids.map(visible)).toEqual(["CUDA_VISIBLE_DEVICES=4", "CUDA_VISIBLE_DEVICES=GPU-5"]);
    await g.shutdown();
    const one = await startTrainer({ device: "cpu", threads: 1, ranks: 1, devices: ["3"] });
    started.push(one as TrainerProcess);
    await one.load({ policy: POLICY });
    expect(visible((one as TrainerProcess).pid)).toBe("CUDA_VISIBLE_DEVICES=3");
    await expect(group({ devices: ["0"] })).rejects.toThrow("2 trainer ranks but 1 devices: 0");
  });

  it("an abort (Ctrl-C) stops every rank", async () => {
    const controller = new AbortController();
    const g = await group({ signal: controller.signal });
    await g.load({ policy: POLICY });
    const pids = g.pids;
    controller.abort();
    await g.exited;
    for (const pid of pids) expect(alive(pid)).toBe(false);
    expect(g.ended?.message).toMatch(/was interrupted/);
    expect(existsSync(g.rendezvous)).toBe(false);
  });
});
