// The portable sgemm (native/src/backend/sgemm_portable.cpp), which the native core uses
// where OpenBLAS is not installed. The core is built once, with -DSEARCHR1_BLAS=portable, into
// a temporary folder (CUDA off: the portable path does not touch it; 40-90 s on 2 cores), and
// checked three ways: no BLAS library is linked; the kernel matches a plain loop on odd
// shapes, in every transpose case, batch- and thread-invariantly (searchr1-gemm-check); and
// the trainer built on it matches the PyTorch fixtures within parity.test.ts's tolerances.
import { execFile } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CPU,
  caseFile,
  get,
  MODELS,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
  trainerOk,
} from "./helpers.js";

const run = promisify(execFile);
const SOURCE = fileURLToPath(new URL("../../native/", import.meta.url));
const BUILD = tempDir();
const TRAINER = join(BUILD, "searchr1-trainer");
const BUILD_MS = 15 * 60_000; // a loaded 2-core machine; it takes ~40 s when idle

beforeAll(async () => {
  const options = { maxBuffer: 64 << 20, timeout: BUILD_MS };
  await run(
    "cmake",
    [
      ...["-S", SOURCE, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release"],
      ...["-DSEARCHR1_BLAS=portable", "-DSEARCHR1_CUDA=OFF"],
    ],
    options,
  );
  await run(
    "cmake",
    [
      ...["--build", BUILD, "--parallel", String(availableParallelism())],
      ...["--target", "searchr1-trainer", "searchr1-gemm-check"],
    ],
    options,
  );
}, BUILD_MS);

afterAll(() => rmSync(BUILD, { recursive: true, force: true }));

describe("the portable sgemm build", () => {
  it("is configured for the portable kernel and links no BLAS library", async () => {
    expect(readFileSync(join(BUILD, "CMakeCache.txt"), "utf8")).toContain(
      "SEARCHR1_BLAS:STRING=portable",
    );
    if (process.platform !== "linux") return; // ldd is Linux's
    const { stdout } = await run("ldd", [TRAINER]);
    expect(stdout).toContain("libc.so"); // ldd did list the libraries
    expect(stdout).not.toMatch(/blas/i);
  });

  it("matches a plain loop on odd shapes in every transpose case, batch- and thread-invariantly", async () => {
    const { stdout } = await run(join(BUILD, "searchr1-gemm-check"), [], {
      env: { ...process.env, OMP_NUM_THREADS: "2" },
    });
    expect(stdout).toContain("sgemm: portable");
    expect(stdout).toMatch(/^ok: \d+ cases match the reference/m);
  });
});

// The same checks and tolerances as parity.test.ts, run with this build's trainer.
describe.each(MODELS)("%s model on the portable sgemm against PyTorch", (model) => {
  it("scores log-probs and entropies within 1e-4", async () => {
    const out = join(tempDir(), "score.safetensors");
    trainerOk(
      ["score", "--model", modelDir(model), "--batch", caseFile(model), "--out", out, ...CPU],
      TRAINER,
    );
    const ref = await readFloats(caseFile(model));
    const got = await readFloats(out);
    expect(maxAbsDiff(get(got, "logprobs"), get(ref, "ref.logprobs"))).toBeLessThan(1e-4);
    expect(maxAbsDiff(get(got, "entropy"), get(ref, "ref.entropy"))).toBeLessThan(1e-4);
  });

  it("computes the weighted loss and every parameter gradient within 1e-3", async () => {
    const out = join(tempDir(), "grad.safetensors");
    trainerOk(
      ["grad", "--model", modelDir(model), "--batch", caseFile(model), "--out", out, ...CPU],
      TRAINER,
    );
    const ref = await readFloats(caseFile(model));
    const got = await readFloats(out);
    const refLoss = get(ref, "ref.loss")[0] ?? Number.NaN;
    expect(Math.abs((get(got, "loss")[0] ?? 0) - refLoss)).toBeLessThan(
      1e-4 * Math.max(1, Math.abs(refLoss)),
    );
    const gradNames = [...ref.keys()].filter((k) => k.startsWith("grad.")).sort();
    expect([...got.keys()].filter((k) => k.startsWith("grad.")).sort()).toEqual(gradNames);
    for (const name of gradNames) {
      const b = get(ref, name);
      const scale = Math.max(maxAbs(b), 1e-6);
      expect(maxAbsDiff(get(got, name), b) / scale, name).toBeLessThan(1e-3);
    }
  });
});
