// One rule for an output that already exists, in every command that writes one: refused with
// exit 2 naming the path and --overwrite; with --overwrite, replaced only once the new output
// is complete (a run that fails leaves the old output as it was).
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { nativeExecutable } from "../src/runtime/native-executable.js";
import { jsonl, put } from "./data/helpers.js";
import { type CliResult, runCli } from "./helpers/cli.js";
import { generateCorpus } from "./retrieval/generated-corpus.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-existing-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CKPT = fileURLToPath(new URL("./ckpt/fixtures/hf", import.meta.url));
const NATIVE = fileURLToPath(new URL("./native/fixtures", import.meta.url));

function trainer(args: string[]): CliResult {
  const r = spawnSync(nativeExecutable("searchr1-trainer"), args, {
    encoding: "utf8",
    timeout: 120_000,
    env: { ...process.env, OMP_NUM_THREADS: "2" },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Every file under `path` with its bytes, to tell whether an output was touched. */
function snapshot(path: string): Map<string, Buffer> {
  const files = new Map<string, Buffer>();
  if (!statSync(path).isDirectory()) return files.set("", readFileSync(path));
  for (const name of readdirSync(path, { recursive: true }) as string[]) {
    const p = join(path, name);
    if (statSync(p).isFile()) files.set(name, readFileSync(p));
  }
  return files;
}

interface Case {
  /** The output the refusal names. */
  out: string;
  /** Runs the command; `good: false` makes it fail part way (bad input). */
  run(extra: string[], good?: boolean): CliResult;
}

const corpus = generateCorpus(50, 3);
const flashrag = join(dir, "flashrag");
put(
  join(flashrag, "nq", "test.jsonl"),
  jsonl([{ id: "t0", question: "who wrote hamlet", golden_answers: ["Shakespeare"] }]),
);
put(
  join(flashrag, "bad", "test.jsonl"),
  jsonl([{ id: "t0", question: "who wrote hamlet", golden_answers: ["Shakespeare"] }, {}]),
);

const CASES: Record<string, Case> = {
  "searchr1 convert": {
    out: join(dir, "hf"),
    run: (extra, good = true) =>
      runCli(
        ["convert", "native-to-hf", "--input", join(CKPT, "untied"), "--out", join(dir, "hf")]
          // A base config the tensors do not fit: refused before anything is written.
          .concat(good ? [] : ["--hf-base", join(CKPT, "llama")], "--quiet", extra),
      ),
  },
  "searchr1 build-index": {
    out: join(dir, "bm25"),
    run: (extra, good = true) => {
      const file = put(
        join(dir, good ? "corpus.jsonl" : "broken.jsonl"),
        `${corpus.join("\n")}\n${good ? "" : "not json\n"}`,
      );
      return runCli(
        ["build-index", "--corpus", file, "--out", join(dir, "bm25"), "--quiet"].concat(extra),
      );
    },
  },
  "searchr1 preprocess": {
    out: join(dir, "data", "test.parquet"),
    run: (extra, good = true) =>
      runCli(
        [
          "preprocess",
          good ? "nq" : "bad",
          "--input",
          flashrag,
          "--out",
          join(dir, "data"),
          "--splits",
          "test",
          "--strict",
          "--quiet",
        ].concat(extra),
      ),
  },
  "searchr1-trainer sft": {
    out: join(dir, "sft"),
    run: (extra, good = true) =>
      trainer(
        [
          "sft",
          "--model",
          join(NATIVE, "untied"),
          "--data",
          good ? join(NATIVE, "untied.case.safetensors") : join(CKPT, "untied", "config.json"),
          "--out",
          join(dir, "sft"),
          "--device",
          "cpu",
        ].concat(extra),
      ),
  },
};

describe("an existing output", () => {
  it.each(Object.keys(CASES))(
    "%s refuses it (exit 2) and --overwrite replaces it only once complete",
    (name) => {
      const c = CASES[name] as Case;
      const first = c.run([]);
      expect(first.code, first.stderr).toBe(0);
      const before = snapshot(c.out);

      const again = c.run([]);
      expect(again.code).toBe(2);
      expect(again.stderr).toContain(`${c.out}: already exists; pass --overwrite to replace it`);
      expect(snapshot(c.out)).toEqual(before);

      const failed = c.run(["--overwrite"], false);
      expect(failed.code).not.toBe(0);
      expect(snapshot(c.out)).toEqual(before);

      const old = statSync(c.out).ino;
      const replaced = c.run(["--overwrite"]);
      expect(replaced.code, replaced.stderr).toBe(0);
      // Renamed into place from a temporary name, so it is a new file or folder.
      expect(statSync(c.out).ino).not.toBe(old);
      expect(readdirSync(dir).filter((f) => /\.(partial|old)-\d+$/.test(f))).toEqual([]);
    },
  );

  it("an empty folder is no output yet: every command writes into it without --overwrite", () => {
    for (const c of Object.values(CASES)) {
      const folder = c.out.endsWith(".parquet") ? join(c.out, "..") : c.out;
      rmSync(folder, { recursive: true, force: true });
      mkdirSync(folder);
      const r = c.run([]);
      expect(r.code, r.stderr).toBe(0);
    }
  });
});
