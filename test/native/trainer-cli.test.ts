// The searchr1-trainer command line: usage errors (exit 2), bad batch files (exit 1),
// outputs that appear only when complete, Ctrl-C, and how TypeScript finds the binary.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { writeSafetensors } from "../../src/tensors/safetensors.js";
import { caseFile, modelDir, tempDir, trainer } from "./helpers.js";

const model = modelDir("untied");

async function batchFile(tensors: Parameters<typeof writeSafetensors>[1]): Promise<string> {
  const file = join(tempDir(), "batch.safetensors");
  await writeSafetensors(file, tensors);
  return file;
}

describe("searchr1-trainer usage", () => {
  it("prints the commands and each command's options", () => {
    const top = trainer(["--help"]);
    expect(top.code).toBe(0);
    expect(top.stdout).toMatch(/score[\s\S]*grad[\s\S]*sft/);
    const sft = trainer(["sft", "--help"]);
    expect(sft.code).toBe(0);
    for (const opt of ["--micro-batch-size", "--lr-schedule", "--recompute", "--save-dtype"]) {
      expect(sft.stdout).toContain(opt);
    }
  });

  // A complete sft command line plus the options under test.
  const sft = (...extra: string[]) => [
    ...["sft", "--model", model, "--data", caseFile("untied"), "--out", "x"],
    ...extra,
  ];
  it.each([
    [[], "Usage: searchr1-trainer"],
    [["train"], "unknown command 'train'"],
    [["score", "--model", model], "--batch is required"],
    [["score", "--modle", model], "unknown option --modle"],
    [
      [
        "score",
        "--model",
        model,
        "--batch",
        caseFile("untied"),
        "--out",
        "x",
        "--logits-chunk",
        "0",
      ],
      "--logits-chunk must be an integer >= 1",
    ],
    [sft("--lr-schedule", "step"), "unknown schedule 'step'"],
    [sft("--warmup-steps", "2"), "the constant schedule has no warmup"],
    [sft("--batch-size", "5"), "--batch-size 5 is larger than the 4 sequences"],
    [sft("--micro-batch-size", "3"), "--micro-batch-size 3 must divide --batch-size 4"],
    [sft("--save-dtype", "int8"), "--save-dtype: unknown dtype 'int8'"],
    [
      ["score", "--model", model, "--batch", caseFile("untied"), "--out", "x", "--device", "tpu"],
      "unknown device 'tpu'",
    ],
  ])("exits 2 for %j", (args, message) => {
    const r = trainer(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(message);
  });
});

describe("searchr1-trainer input errors", () => {
  it("names a token outside the vocabulary and its position", async () => {
    const file = await batchFile([
      { name: "input_ids", dtype: "I64", shape: [1, 3], data: BigInt64Array.from([5n, 512n, 7n]) },
    ]);
    const r = trainer(["score", "--model", model, "--batch", file, "--out", join(tempDir(), "o")]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `${file}: tensor 'input_ids' holds token 512 at [0, 1], outside the vocabulary [0, 512)`,
    );
  });

  it("names a mask value that is not 0 or 1, and a mask of the wrong shape", async () => {
    const ids = {
      name: "input_ids",
      dtype: "I32" as const,
      shape: [1, 3],
      data: Int32Array.from([5, 6, 7]),
    };
    const bad = await batchFile([
      ids,
      { name: "attention_mask", dtype: "I32", shape: [1, 3], data: Int32Array.from([1, 2, 1]) },
    ]);
    const r1 = trainer(["score", "--model", model, "--batch", bad, "--out", join(tempDir(), "o")]);
    expect(r1.stderr).toContain("tensor 'attention_mask' holds 2 at [0, 1]; expected 0 or 1");
    const shape = await batchFile([
      ids,
      { name: "attention_mask", dtype: "I32", shape: [3], data: Int32Array.from([1, 1, 1]) },
    ]);
    const r2 = trainer([
      "score",
      "--model",
      model,
      "--batch",
      shape,
      "--out",
      join(tempDir(), "o"),
    ]);
    expect(r2.stderr).toContain("tensor 'attention_mask' has shape [3]; expected [1, 3]");
  });

  it("requires the weights of the objective for grad, and input_ids everywhere", async () => {
    const ids = await batchFile([
      { name: "input_ids", dtype: "I32", shape: [1, 3], data: Int32Array.from([5, 6, 7]) },
    ]);
    const r1 = trainer(["grad", "--model", model, "--batch", ids, "--out", join(tempDir(), "o")]);
    expect(r1.code).toBe(1);
    expect(r1.stderr).toContain(`${ids}: tensor 'weights' is missing`);
    const none = await batchFile([
      { name: "tokens", dtype: "I32", shape: [1, 1], data: Int32Array.from([5]) },
    ]);
    const r2 = trainer(["score", "--model", model, "--batch", none, "--out", join(tempDir(), "o")]);
    expect(r2.stderr).toContain("tensor 'input_ids' is missing");
  });

  it("refuses a batch whose loss mask selects nothing", async () => {
    const file = await batchFile([
      { name: "input_ids", dtype: "I32", shape: [1, 3], data: Int32Array.from([5, 6, 7]) },
      { name: "loss_mask", dtype: "I32", shape: [1, 3], data: Int32Array.from([0, 0, 0]) },
    ]);
    const out = join(tempDir(), "o");
    const r = trainer(["sft", "--model", model, "--data", file, "--out", out]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("step 1: its sequences have no loss tokens");
    expect(readdirSync(join(out, ".."))).toEqual([]);
  });

  it("never replaces an existing folder without --overwrite", () => {
    const out = join(tempDir(), "existing");
    mkdirSync(out);
    writeFileSync(join(out, "keep.txt"), "mine");
    const args = ["sft", "--model", model, "--data", caseFile("untied"), "--out", out, "--lr", "0"];
    const r = trainer(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`${out}: already exists; pass --overwrite to replace it`);
    expect(readdirSync(out)).toEqual(["keep.txt"]);
    expect(trainer([...args, "--overwrite"]).code).toBe(0);
    expect(readdirSync(out).sort()).toEqual(["config.json", "model.safetensors"]);
  });

  it("stops on Ctrl-C with exit 130 and leaves no folder behind", async () => {
    const dir = tempDir();
    const out = join(dir, "out");
    const child = spawn(nativeExecutable("searchr1-trainer"), [
      ...[
        "sft",
        "--model",
        model,
        "--data",
        caseFile("untied"),
        "--out",
        out,
        "--steps",
        "1000000",
      ],
    ]);
    await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
    child.kill("SIGINT");
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    expect(code).toBe(130);
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe("finding the native executables", () => {
  afterEach(() => vi.unstubAllEnvs());

  it("uses SEARCHR1_NATIVE_DIR and says how to build when the binary is absent", () => {
    const empty = tempDir();
    vi.stubEnv("SEARCHR1_NATIVE_DIR", empty);
    expect(() => nativeExecutable("searchr1-trainer")).toThrow(
      `${join(empty, "searchr1-trainer")}: the native searchr1-trainer is not built (from SEARCHR1_NATIVE_DIR)`,
    );
  });

  it("finds the build under native/build by default", () => {
    vi.stubEnv("SEARCHR1_NATIVE_DIR", "");
    expect(existsSync(nativeExecutable("searchr1-trainer"))).toBe(true);
  });
});
