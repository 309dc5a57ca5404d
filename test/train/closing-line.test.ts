// `train`'s closing line, `done: <run folder> (what it wrote)`, names only what the run wrote:
// which of metrics.jsonl, plots/ and tensorboard/ depends on trainer.logger. Two one-step runs
// cover every logger choice: those that write files (jsonl, plot, tensorboard; with
// trainer.profile too), and console with wandb (a stand-in server), which write none of them.
import { existsSync, readdirSync, statSync } from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCli } from "../helpers/cli.js";
import { startWandbStandIn } from "../helpers/wandb-server.js";
import { runDir, type SmallRun, smallRun } from "./small-run.js";

let run: SmallRun;

beforeAll(() => {
  run = smallRun("searchr1-closing-line-");
}, 60_000);

afterAll(() => run?.cleanup());

const oneStep = ["trainer.total_training_steps=1", "trainer.val_before_train=false"];

/** The run folder and the names of `done: <dir> (a, b, ...)`, all that `train` prints on stdout. */
function closingLine(stdout: string): { dir: string; names: string[] } {
  const m = /^done: (\S+)(?: \((.*)\))?\n$/.exec(stdout);
  expect(m, stdout).not.toBeNull();
  return { dir: m?.[1] as string, names: m?.[2]?.split(", ") ?? [] };
}

/** A name of the closing line is there: a file, a folder with something in it, or a glob's match. */
function expectWritten(dir: string, name: string): void {
  if (name === "global_step_*/") {
    const steps = readdirSync(dir).filter((f) => /^global_step_\d+$/.test(f));
    expect(steps, name).not.toHaveLength(0);
    return;
  }
  const at = path.join(dir, name);
  expect(existsSync(at), name).toBe(true);
  if (name.endsWith("/")) expect(readdirSync(at), name).not.toHaveLength(0);
  else expect(statSync(at).isFile(), name).toBe(true);
}

describe("train's closing line names what the run wrote", () => {
  it("trainer.logger=[jsonl,plot,tensorboard] and trainer.profile: each of them", async () => {
    const out = path.join(run.dir, "files");
    const r = await startCli(
      run.args(out, [
        ...oneStep,
        "trainer.logger=[jsonl,plot,tensorboard]",
        "trainer.profile=true",
      ]),
    ).result;
    expect(r.code, r.stderr).toBe(0);
    const { dir, names } = closingLine(r.stdout);
    expect(dir).toBe(runDir(out));
    expect(names).toEqual([
      "metrics.jsonl",
      "plots/",
      "tensorboard/",
      "validation/",
      "profile.jsonl",
      "global_step_*/",
    ]);
    for (const name of names) expectWritten(dir, name);
  }, 240_000);

  it("trainer.logger=[console,wandb]: neither metrics.jsonl nor plots/", async () => {
    const key = "k".repeat(40);
    const server = await startWandbStandIn({ apiKey: key });
    const out = path.join(run.dir, "console-wandb");
    try {
      const r = await startCli(run.args(out, [...oneStep, "trainer.logger=[console,wandb]"]), {
        env: {
          WANDB_API_KEY: key,
          WANDB_BASE_URL: server.url,
          WANDB_MODE: "",
          WANDB_ENTITY: "",
          WANDB_RUN_ID: "",
        },
      }).result;
      expect(r.code, r.stderr).toBe(0);
      expect(server.history()).toHaveLength(1);
      const { dir, names } = closingLine(r.stdout);
      expect(names).toEqual(["validation/", "global_step_*/"]);
      for (const name of names) expectWritten(dir, name);
      for (const absent of ["metrics.jsonl", "plots", "tensorboard", "profile.jsonl"]) {
        expect(existsSync(path.join(dir, absent)), absent).toBe(false);
      }
    } finally {
      await server.close();
    }
  }, 240_000);
});
