import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { locateFsdp } from "../../src/ckpt/fsdp.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-flayout-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function actor(root: string, step: number, world: number, ranks = world): string {
  const a = join(root, `global_step_${step}`, "actor");
  mkdirSync(a, { recursive: true });
  for (let r = 0; r < ranks; r++)
    writeFileSync(join(a, `model_world_size_${world}_rank_${r}.pt`), "");
  return a;
}

describe("locateFsdp", () => {
  it("finds the actor folder from the root, a step or itself; world size from the file names", () => {
    const root = join(dir, "a");
    const a = actor(root, 100, 4);
    for (const input of [root, join(root, "global_step_100"), a]) {
      const layout = locateFsdp(input);
      expect([layout.actorDir, layout.worldSize, layout.files.length]).toEqual([a, 4, 4]);
    }
  });

  it("prefers the tracker file and fsdp_config.json, and names what is missing", () => {
    const root = join(dir, "b");
    actor(root, 100, 2);
    const latest = actor(root, 200, 2, 1);
    expect(() => locateFsdp(root)).toThrow("several steps (global_step_100, global_step_200)");
    writeFileSync(join(root, "latest_checkpointed_iteration.txt"), "200");
    expect(() => locateFsdp(root)).toThrow(
      `${join(latest, "model_world_size_2_rank_1.pt")}: missing (world size 2)`,
    );
    writeFileSync(
      join(latest, "fsdp_config.json"),
      JSON.stringify({ FSDP_version: 1, world_size: 1 }),
    );
    writeFileSync(join(latest, "model_world_size_1_rank_0.pt"), "");
    expect(locateFsdp(root)).toMatchObject({ actorDir: latest, worldSize: 1 });
    writeFileSync(join(latest, "fsdp_config.json"), JSON.stringify({ world_size: "two" }));
    expect(() => locateFsdp(root)).toThrow(
      'fsdp_config.json: field "world_size" must be a positive integer',
    );
    writeFileSync(join(latest, "fsdp_config.json"), "{world_size: 1");
    expect(() => locateFsdp(root)).toThrow("fsdp_config.json: invalid JSON");
    expect(() => locateFsdp(join(dir, "nothing"))).toThrow("no such checkpoint folder");
  });
});
