// The portable sgemm (native/src/backend/sgemm_portable.cpp), which the native core uses
// where OpenBLAS is not installed. The core is built once, with -DSEARCHR1_BLAS=portable, into
// a temporary folder (CUDA off: the portable path does not touch it; 40-90 s on 2 cores), and
// checked three ways: no BLAS library is linked; the kernel matches a plain loop on odd
// shapes, in every transpose case, batch- and thread-invariantly (searchr1-gemm-check); and
// the trainer built on it matches the PyTorch fixtures within parity.test.ts's tolerances.
// The same build is also without Gloo (-DSEARCHR1_GLOO=OFF), the other optional library: one
// trainer rank runs, and more CPU ranks are refused with the line that installs it.
import { execFile } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODELS, tempDir } from "./helpers.js";
import { itMatchesPyTorch } from "./parity-checks.js";

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
      ...["-DSEARCHR1_BLAS=portable", "-DSEARCHR1_CUDA=OFF", "-DSEARCHR1_GLOO=OFF"],
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

describe("the build without Gloo", () => {
  it("links no Gloo and refuses CPU ranks with the line that installs it", async () => {
    const info = JSON.parse((await run(TRAINER, ["info"])).stdout);
    expect(info.ranks).toEqual({ gloo: false, nccl: false });
    if (process.platform === "linux") {
      expect((await run("ldd", [TRAINER])).stdout).not.toMatch(/gloo/i);
    }
    const refused = await run(
      TRAINER,
      ["serve", "--device", "cpu", "--rank", "0", "--world-size", "2", "--rendezvous", tempDir()],
      { timeout: 60_000 },
    ).then(
      () => null,
      (err: { code?: number; stderr?: string }) => err,
    );
    expect(refused?.code).toBe(2);
    expect(refused?.stderr).toContain(
      "--world-size 2: CPU ranks need Gloo, which this build of the native core lacks; install " +
        "it (Debian/Ubuntu: apt-get install libgloo-dev) and rebuild (npm run build:native)",
    );
  });
});

// parity.test.ts's score and grad checks, with the same tolerances, on this build's trainer.
describe.each(MODELS)("%s model on the portable sgemm against PyTorch", (model) => {
  itMatchesPyTorch(model, TRAINER);
});
