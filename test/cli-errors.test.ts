import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { describeSystemError } from "../src/runtime/errors.js";
import { BIN, runCli } from "./helpers/cli.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-errors-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** No "internal error" and no stack trace: a foreseeable condition is one clean line. */
function expectOneLine(stderr: string) {
  expect(stderr).not.toMatch(/internal error/);
  expect(stderr).not.toMatch(/^\s+at /m);
  expect(stderr.trim().split("\n")).toHaveLength(1);
}

describe("foreseeable conditions are one-line errors", () => {
  it("names the path and what the system refused, for a file in the way of a folder", () => {
    const file = join(dir, "a-file");
    writeFileSync(file, "x");
    const corpus = join(dir, "corpus.jsonl");
    writeFileSync(corpus, `${JSON.stringify({ id: "0", contents: '"T"\nhello' })}\n`);
    const r = runCli(["build-index", "--corpus", corpus, "--out", join(file, "idx"), "--quiet"]);
    expect(r.code).toBe(1);
    expectOneLine(r.stderr);
    expect(r.stderr).toContain(`searchr1: error: ${file}`);
    expect(r.stderr).toMatch(/not a folder|where a folder is needed/);
  });

  it("says a config file that is a folder is not a file", () => {
    const r = runCli(["config", "download", "-c", dir, "save_path=x"]);
    expect(r.code).toBe(2);
    expectOneLine(r.stderr);
    expect(r.stderr).toMatch(/config: not a file: /);
  });

  it("describes the operating system's refusals and leaves other errors alone", () => {
    const err = (code: string, syscall: string, path?: string) =>
      Object.assign(new Error(code), { code, syscall, path });
    expect(describeSystemError(err("EACCES", "open", "/data/x"))).toBe(
      "/data/x: permission denied (open, EACCES)",
    );
    expect(describeSystemError(err("ENOSPC", "write"))).toBe(
      "no space left on the device (write, ENOSPC)",
    );
    expect(describeSystemError(new Error("a bug"))).toBeUndefined();
    expect(describeSystemError(err("EBADF", "read", "/x"))).toBeUndefined();
  });

  it("ends quietly when the reader of stdout goes away (searchr1 config ... | head)", async () => {
    const child = spawn(process.execPath, [BIN, "config", "train", "model.path=m"]);
    // Closed before the CLI writes: its first write meets a closed pipe (EPIPE).
    child.stdout.destroy();
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });
});
