// `searchr1 convert peft-to-hf`: a PEFT LoRA adapter merged into its base model's HF folder,
// checked against make_lora_fixtures.py's merge (PEFT's get_delta_weight restated in
// PyTorch, float64), against the native trainer's `export` of the same adapter (bit for
// bit: the same arithmetic), on a bf16 base, and on bad adapters.
import { cpSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensors, toFloat32 } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import {
  FIXTURES,
  get,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
} from "../native/helpers.js";
import { Ranks } from "../native/trainer-ranks.js";

const BASE = modelDir("untied");
const LORA = join(FIXTURES, "lora");
const CASES = join(LORA, "case.safetensors");

const relDiff = (a: Float32Array, b: Float32Array): number =>
  maxAbsDiff(a, b) / Math.max(maxAbs(b), 1e-30);
const sameBits = (a: Float32Array, b: Float32Array): boolean =>
  Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength),
  );

function convert(input: string, out: string, ...extra: string[]) {
  return runCli(["convert", "peft-to-hf", "--input", input, "--out", out, "--quiet", ...extra]);
}

describe("searchr1 convert peft-to-hf", () => {
  for (const tag of ["adapter", "rslora"] as const) {
    it(`${tag}: the targeted weights are W + scaling·B A, the rest the base's bits`, async () => {
      const out = join(tempDir(), "merged");
      const r = convert(join(LORA, tag), out, "--hf-base", BASE);
      expect(r.code, r.stderr).toBe(0);
      const ref = await readFloats(CASES);
      const expected = [...ref.keys()].filter((n) => n.startsWith(`${tag}.merged.`)).length;
      expect(r.stdout).toContain(`on ${expected} weights`);
      const merged = await readFloats(join(out, "model.safetensors"));
      const base = await readFloats(join(BASE, "model.safetensors"));
      let targeted = 0;
      for (const [name, values] of merged) {
        const want = ref.get(`${tag}.merged.${name}`);
        if (want === undefined) {
          expect(sameBits(values, get(base, name)), name).toBe(true);
        } else {
          targeted++;
          expect(relDiff(values, want), name).toBeLessThan(1e-6);
          expect(maxAbsDiff(values, get(base, name)), name).toBeGreaterThan(1e-4);
        }
      }
      expect(targeted).toBe(expected);
      expect(readFileSync(join(out, "config.json"), "utf8")).toBe(
        readFileSync(join(BASE, "config.json"), "utf8"),
      );
    });
  }

  it("equals the native trainer's export of the same adapter, bit for bit", async () => {
    const out = join(tempDir(), "merged");
    // Without --hf-base: the adapter's base_model_name_or_path, ../../untied from its folder.
    expect(convert(join(LORA, "adapter"), out).code).toBe(0);
    const exported = join(tempDir(), "exported");
    const ranks = new Ranks(1, 60);
    try {
      await ranks.ok("load", { policy: BASE, lora: { path: join(LORA, "adapter") } });
      await ranks.ok("export", { out: exported, dtype: "fp32" });
    } finally {
      await ranks.close();
    }
    const ours = await readFloats(join(out, "model.safetensors"));
    const theirs = await readFloats(join(exported, "model.safetensors"));
    expect([...ours.keys()].sort()).toEqual([...theirs.keys()].sort());
    for (const [name, values] of ours) expect(sameBits(values, get(theirs, name)), name).toBe(true);
  });

  it("a bf16 base stays bf16: the merge rounded once to it", async () => {
    const dir = tempDir();
    const bf16 = join(dir, "base-bf16");
    expect(
      runCli([
        "convert",
        "native-to-hf",
        "--input",
        BASE,
        "--out",
        bf16,
        "--dtype",
        "bf16",
        "--quiet",
      ]).code,
    ).toBe(0);
    const out = join(dir, "merged");
    expect(convert(join(LORA, "adapter"), out, "--hf-base", bf16).code).toBe(0);
    const merged = await readSafetensors(join(out, "model.safetensors"));
    const base = await readSafetensors(join(bf16, "model.safetensors"));
    const ref = await readFloats(CASES);
    for (const [name, t] of merged) {
      expect(t.dtype, name).toBe("BF16");
      const want = ref.get(`adapter.merged.${name}`);
      if (want === undefined) expect(t.data).toEqual(get(base, name).data);
      // bf16 keeps 8 significant bits (the base's rounding and the merge's): 2^-7 of the largest.
      else expect(relDiff(toFloat32(t), want), name).toBeLessThan(1 / 128);
    }
  });

  it("refuses what it cannot merge, naming the file and field, and writes nothing", () => {
    const dir = tempDir();
    const adapter = (name: string, edit: (c: Record<string, unknown>) => void) => {
      const copy = join(dir, name);
      cpSync(join(LORA, "adapter"), copy, { recursive: true });
      const file = join(copy, "adapter_config.json");
      const config = JSON.parse(readFileSync(file, "utf8"));
      edit(config);
      writeFileSync(file, JSON.stringify(config));
      return copy;
    };
    const cases: [string, string[], number, RegExp][] = [
      [
        adapter("dora", (c) => {
          c.use_dora = true;
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: use_dora is true/,
      ],
      [
        adapter("hub", (c) => {
          c.base_model_name_or_path = "Qwen/Qwen2.5-3B";
        }),
        [],
        2,
        /--hf-base is required .*"Qwen\/Qwen2\.5-3B" is not a local folder/,
      ],
      [
        adapter("rank", (c) => {
          c.r = 8;
        }),
        ["--hf-base", BASE],
        1,
        /do not have rank r = 8/,
      ],
      [
        adapter("ia3", (c) => {
          c.peft_type = "IA3";
        }),
        ["--hf-base", BASE],
        1,
        /peft_type is "IA3", not "LORA"/,
      ],
      // A smaller model (hidden 16) with the same tensor names.
      [
        join(LORA, "adapter"),
        ["--hf-base", join(import.meta.dirname, "fixtures", "hf", "untied")],
        1,
        /do not fit the base weight/,
      ],
    ];
    for (const [input, extra, code, message] of cases) {
      const out = join(dir, `out-${input.split("/").at(-1)}-${extra.length}`);
      const r = convert(input, out, ...extra);
      expect(r.code, input).toBe(code);
      expect(r.stderr, input).toMatch(message);
      expect(existsSync(out), input).toBe(false);
    }
  });
});
