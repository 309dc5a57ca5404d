// --profile (native/src/backend/profiled_backend.h): the trainer's score and sft and the
// engine time every backend operation and print the table to stderr when they end. On the
// CPU the timer is the clock; on a GPU, CUDA events (bench/gpu.sh runs it there).
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { describe, expect, it } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { ServeProcess } from "../helpers/serve-process.js";
import { CPU, caseFile, modelDir, tempDir, trainerOk } from "./helpers.js";

interface Row {
  calls: number;
  ms: number;
}

/** The profile table's rows by operation, and its "all operations" and wall-time lines. */
function parseProfile(stderr: string): { ops: Map<string, Row>; all: number; wall: number } {
  const start = stderr.indexOf("profile (cpu, device time per operation):");
  expect(start, stderr).toBeGreaterThanOrEqual(0);
  const ops = new Map<string, Row>();
  let all = Number.NaN;
  let wall = Number.NaN;
  for (const line of stderr.slice(start).split("\n").slice(2)) {
    const row = /^ {2}(\S.*?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$/.exec(line);
    const total = /^ {2}all operations\s+([\d.]+)$/.exec(line);
    const w = /^ {2}wall time ([\d.]+) ms/.exec(line);
    if (row) ops.set(row[1] as string, { calls: Number(row[2]), ms: Number(row[3]) });
    else if (total) all = Number(total[1]);
    else if (w) wall = Number(w[1]);
  }
  return { ops, all, wall };
}

const calls = (ops: Map<string, Row>, op: string): number => ops.get(op)?.calls ?? 0;

describe("searchr1-trainer --profile", () => {
  // untied: 2 layers, hidden 64, 4 heads of 16, 2 kv heads (qkv 64 -> 128), vocab 512.
  const score = (extra: string[]) =>
    trainerOk([
      ...["score", "--model", modelDir("untied"), "--batch", caseFile("untied")],
      ...["--out", join(tempDir(), "scores.safetensors"), ...CPU, ...extra],
    ]);

  it("score: each operation once per layer and pass, the head once per pass, totals that add up", () => {
    const { ops, all, wall } = parseProfile(score(["--profile", "--repeat", "3"]).stderr);
    expect(calls(ops, "matmul_forward 64x128")).toBe(2 * 3); // qkv
    expect(calls(ops, "attention_forward")).toBe(2 * 3);
    expect(calls(ops, "matmul_forward 64x512")).toBeGreaterThanOrEqual(3); // the head's chunks
    expect(calls(ops, "logprob_forward")).toBe(calls(ops, "matmul_forward 64x512"));
    // Loading the model (uploads of the weights) is not in the table.
    expect(calls(ops, "to_x")).toBe(0);
    const sum = [...ops.values()].reduce((a, r) => a + r.ms, 0);
    expect(Math.abs(sum - all)).toBeLessThan(0.01 * ops.size + 1e-9);
    expect(all).toBeLessThanOrEqual(wall);
  });

  it("without --profile, no table", () => {
    expect(score([]).stderr).not.toContain("device time per operation");
  });

  it("sft: the backward operations and one optimizer update per parameter tensor and step", () => {
    const out = join(tempDir(), "model");
    const r = trainerOk([
      ...["sft", "--model", modelDir("untied"), "--data", caseFile("untied"), "--out", out],
      ...["--steps", "2", "--profile", ...CPU],
    ]);
    const { ops } = parseProfile(r.stderr);
    expect(calls(ops, "attention_backward")).toBe(2 * 2);
    expect(calls(ops, "matmul_backward 64x128")).toBe(2 * 2);
    expect(calls(ops, "adamw_update") % 2).toBe(0);
    expect(calls(ops, "adamw_update")).toBeGreaterThan(0);
  });
});

describe("searchr1-engine --profile", () => {
  it("one request of 8 tokens: 8 steps of every layer, one sample_tokens per step", async () => {
    const request = {
      ...{ op: "generate", rid: "a", input_ids: [1, 2, 3, 4, 5], max_new_tokens: 8 },
      ...{ temperature: 0, top_p: 1, top_k: -1, min_p: 0, seed: 1 },
      ...{ stop_token_ids: [], ignore_eos: true },
    };
    const engine = spawn(
      nativeExecutable("searchr1-engine"),
      ["--model", join("test", "engine", "fixtures", "qwen-hd16"), ...CPU, "--profile"],
      { env: { ...process.env, OMP_NUM_THREADS: "2" } },
    );
    let stderr = "";
    engine.stderr.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    const exited = new Promise<number | null>((resolve) => engine.on("close", resolve));
    engine.stdin.write(`${JSON.stringify(request)}\n`);
    // Shut down once the request is done (shutdown aborts what is still running).
    for await (const line of createInterface({ input: engine.stdout })) {
      if (line.includes('"ev":"done"')) {
        expect(line).toContain('"reason":"length"');
        engine.stdin.end(`${JSON.stringify({ op: "shutdown" })}\n`);
      }
    }
    expect(await exited, stderr).toBe(0);
    const { ops, all, wall } = parseProfile(stderr);
    expect(calls(ops, "sample_tokens")).toBe(8);
    expect(calls(ops, "paged_attention")).toBe(3 * 8); // 3 layers
    expect(all).toBeLessThanOrEqual(wall);
  });

  // The `profile` command (native/src/engine/PROTOCOL.md): the times since the last one, per
  // operation, as JSON; the table starts afresh. Without --profile it is refused and the
  // engine goes on serving.
  for (const profiled of [true, false]) {
    it(`the profile command ${profiled ? "returns the times since the last one" : "is refused without --profile"}`, async () => {
      const engine = spawn(
        nativeExecutable("searchr1-engine"),
        [
          ...["--model", join("test", "engine", "fixtures", "qwen-hd16"), ...CPU],
          ...(profiled ? ["--profile"] : []),
        ],
        { env: { ...process.env, OMP_NUM_THREADS: "2" } },
      );
      const exited = new Promise<number | null>((resolve) => engine.on("close", resolve));
      const lines = createInterface({ input: engine.stdout })[Symbol.asyncIterator]();
      const next = async (match: string) => {
        for (;;) {
          const { value, done } = await lines.next();
          if (done) throw new Error(`the engine ended before ${match}`);
          if ((value as string).includes(match)) return JSON.parse(value as string);
        }
      };
      const generate = (rid: string) =>
        engine.stdin.write(
          `${JSON.stringify({
            ...{ op: "generate", rid, input_ids: [1, 2, 3, 4, 5], max_new_tokens: 4 },
            ...{ temperature: 0, top_p: 1, top_k: -1, min_p: 0, seed: 1 },
            ...{ stop_token_ids: [], ignore_eos: true },
          })}\n`,
        );
      const profile = (id: number) => {
        engine.stdin.write(`${JSON.stringify({ op: "profile", id })}\n`);
        return next(`"id":${id}`);
      };
      generate("a");
      await next('"ev":"done"');
      const first = await profile(1);
      if (profiled) {
        type Op = { op: string; calls: number; ms: number };
        const ops = first.ops as Op[];
        expect(first.ok).toBe(true);
        expect(ops.find((o) => o.op === "sample_tokens")?.calls).toBe(4);
        expect(ops.find((o) => o.op === "paged_attention")?.calls).toBe(3 * 4);
        const sum = ops.reduce((t, o) => t + o.ms, 0);
        expect(first.device_ms).toBeCloseTo(sum, 6);
        expect((await profile(2)).ops).toEqual([]); // started afresh
      } else {
        expect(first).toMatchObject({
          ok: false,
          message: "this engine was started without --profile",
        });
      }
      generate("b"); // still serving
      await next('"ev":"done"');
      engine.stdin.end(`${JSON.stringify({ op: "shutdown" })}\n`);
      expect(await exited).toBe(0);
    });
  }
});

describe("searchr1-trainer serve --profile: the profile command", () => {
  const serve = (extra: string[]) =>
    new ServeProcess(
      nativeExecutable("searchr1-trainer"),
      ["serve", ...CPU, "--threads", "2", ...extra],
      { ...process.env, OMP_NUM_THREADS: "2" },
    );

  it("returns each operation's device time since the last call, largest first, then starts afresh", async () => {
    const s = serve(["--profile"]);
    await s.ok("load", { policy: modelDir("untied") });
    const loaded = (await s.ok("profile")) as { ops: { op: string; calls: number; ms: number }[] };
    // Loading converts the weights (to_x); no layer ran yet.
    expect(loaded.ops.some((o) => o.op === "attention_forward")).toBe(false);
    const out = join(tempDir(), "lp.safetensors");
    await s.ok("log_probs", { batch: caseFile("untied"), out });
    const p = (await s.ok("profile")) as {
      ops: { op: string; calls: number; ms: number }[];
      device_ms: number;
    };
    const calls = new Map(p.ops.map((o) => [o.op, o.calls]));
    expect(calls.get("attention_forward")).toBe(2); // one pass, 2 layers
    expect(calls.get("matmul_forward 64x128")).toBe(2);
    expect(calls.has("attention_backward")).toBe(false);
    expect(p.ops.map((o) => o.ms)).toEqual([...p.ops.map((o) => o.ms)].sort((a, b) => b - a));
    const sum = p.ops.reduce((a, o) => a + o.ms, 0);
    expect(Math.abs(sum - p.device_ms)).toBeLessThan(1e-9 + 1e-9 * sum);
    expect(((await s.ok("profile")) as { ops: unknown[] }).ops).toEqual([]);
    expect(await s.close()).toBe(0);
  });

  it("is refused without --profile, and the trainer goes on serving", async () => {
    const s = serve([]);
    expect(await s.fails("profile")).toBe("profile: this trainer was started without --profile");
    await s.ok("load", { policy: modelDir("untied") });
    expect(await s.close()).toBe(0);
  });
});
