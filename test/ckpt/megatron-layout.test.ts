import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { locateMegatron } from "../../src/ckpt/megatron-layout.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-mlayout-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A checkpoint skeleton: empty rank files under `root/<iter>/<rank dir>/`. */
function skeleton(root: string, iter: string, ranks: string[], file = "model_optim_rng.pt") {
  for (const r of ranks) {
    mkdirSync(join(root, iter, r), { recursive: true });
    writeFileSync(join(root, iter, r, file), "");
  }
  return root;
}

describe("locateMegatron", () => {
  it("follows latest_checkpointed_iteration.txt and reads TP × PP from the folder names", () => {
    const root = skeleton(join(dir, "a"), "iter_0000020", [
      "mp_rank_00_000",
      "mp_rank_01_000",
      "mp_rank_00_001",
      "mp_rank_01_001",
    ]);
    skeleton(root, "iter_0000010", ["mp_rank_00_000"]);
    writeFileSync(join(root, "latest_checkpointed_iteration.txt"), "20\n");
    const layout = locateMegatron(root);
    expect(layout.iterDir).toBe(join(root, "iter_0000020"));
    expect([layout.tp, layout.pp]).toEqual([2, 2]);
    expect(layout.files[1]?.[0]).toBe(
      join(root, "iter_0000020", "mp_rank_00_001", "model_optim_rng.pt"),
    );
  });

  it("takes `release`, an iteration folder itself, or the only folder inside (RLinf's actor/)", () => {
    const rel = skeleton(join(dir, "rel"), "release", ["mp_rank_00"]);
    writeFileSync(join(rel, "latest_checkpointed_iteration.txt"), "release");
    expect(locateMegatron(rel).iterDir).toBe(join(rel, "release"));
    const one = skeleton(
      join(dir, "one"),
      "iter_0000005",
      ["mp_rank_00", "mp_rank_01"],
      "model_rng.pt",
    );
    expect(locateMegatron(one)).toMatchObject({ tp: 2, pp: 1 });
    expect(locateMegatron(join(one, "iter_0000005")).iterDir).toBe(join(one, "iter_0000005"));
  });

  it("says what is wrong: several iterations, a bad tracker, missing ranks, expert folders", () => {
    const many = skeleton(join(dir, "many"), "iter_0000001", ["mp_rank_00"]);
    skeleton(many, "iter_0000002", ["mp_rank_00"]);
    expect(() => locateMegatron(many)).toThrow("several iterations (iter_0000001, iter_0000002)");
    const bad = skeleton(join(dir, "bad"), "iter_0000001", ["mp_rank_00"]);
    writeFileSync(join(bad, "latest_checkpointed_iteration.txt"), "latest");
    expect(() => locateMegatron(bad)).toThrow(
      'expected an iteration number or "release", got "latest"',
    );
    const gap = skeleton(join(dir, "gap"), "iter_0000001", ["mp_rank_00_000", "mp_rank_01_001"]);
    expect(() => locateMegatron(gap)).toThrow(
      `${join(gap, "iter_0000001", "mp_rank_01_000")}: missing`,
    );
    const moe = skeleton(join(dir, "moe"), "iter_0000001", ["mp_rank_00_000_001"]);
    expect(() => locateMegatron(moe)).toThrow("expert-parallel checkpoints are not supported");
    mkdirSync(join(dir, "nofile", "iter_0000001", "mp_rank_00"), { recursive: true });
    expect(() => locateMegatron(join(dir, "nofile"))).toThrow(
      "no model_optim_rng.pt / model_rng.pt / model.pt",
    );
    expect(() => locateMegatron(join(dir, "absent"))).toThrow("no such checkpoint folder");
  });
});
