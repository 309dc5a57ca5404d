// `searchr1 convert peft-to-hf`: a PEFT LoRA adapter merged into its base model's HF folder,
// checked bit for bit against make_lora_fixtures.py's merge (PEFT's get_delta_weight restated
// in PyTorch, float64, rounded once) and make_peft_fixtures.py's (a bf16 base; an
// adapter_model.bin), within float32 rounding of PEFT's own float32 arithmetic, bit for bit
// against the native trainer's `export` of an adapter it trained and saved, and on adapters
// whose adapter_config.json selects modules as PEFT does (lists, regexes, "all-linear",
// layers_to_transform, exclude_modules) or asks for what is not merged here.
import { cpSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import {
  FIXTURES,
  get,
  maxAbsDiff,
  modelDir,
  readFloats,
  relDiff,
  rolloutBatch,
  sameBits,
  tempDir,
  writeBatchFile,
} from "../native/helpers.js";
import { Ranks } from "../native/trainer-ranks.js";

const BASE = modelDir("untied");
const LORA = join(FIXTURES, "lora");
const CASES = join(LORA, "case.safetensors");
const PEFT = join(import.meta.dirname, "fixtures", "peft");

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
          expect(sameBits(values, want), name).toBe(true);
          expect(maxAbsDiff(values, get(base, name)), name).toBeGreaterThan(1e-4);
        }
      }
      expect(targeted).toBe(expected);
      expect(readFileSync(join(out, "config.json"), "utf8")).toBe(
        readFileSync(join(BASE, "config.json"), "utf8"),
      );
    });
  }

  it("PEFT's own float32 merge differs from it by float32 rounding only", async () => {
    const out = join(tempDir(), "merged");
    expect(convert(join(LORA, "adapter"), out, "--hf-base", BASE).code).toBe(0);
    const merged = await readFloats(join(out, "model.safetensors"));
    const ref = await readFloats(join(PEFT, "expected.safetensors"));
    const names = [...ref.keys()].filter((n) => n.startsWith("peft.")).map((n) => n.slice(5));
    expect(names).toHaveLength(7); // layer 0's linear layers
    let differ = 0;
    for (const name of names) {
      const [ours, theirs] = [get(merged, name), get(ref, `peft.${name}`)];
      expect(relDiff(ours, theirs), name).toBeLessThan(1e-6);
      differ += ours.filter((x, i) => x !== theirs[i]).length;
    }
    expect(differ).toBeGreaterThan(0); // B A and its scaling rounded to float32 first
  });

  it("reads adapter_model.bin (save_pretrained(safe_serialization=False)) as the safetensors", async () => {
    const [a, b] = [join(tempDir(), "st"), join(tempDir(), "bin")];
    expect(convert(join(LORA, "adapter"), a, "--hf-base", BASE).code).toBe(0);
    const r = convert(join(PEFT, "adapter-bin"), b, "--hf-base", BASE);
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(join(b, "model.safetensors"))).toEqual(
      readFileSync(join(a, "model.safetensors")),
    );
  });

  it("an adapter the native trainer trained and saved equals its own merged export, bit for bit", async () => {
    const dir = tempDir();
    const ckpt = join(dir, "ckpt");
    const exported = join(dir, "exported");
    const ranks = new Ranks(1, 60);
    try {
      await ranks.ok("load", {
        policy: BASE,
        lora: { path: join(LORA, "adapter") },
        actor_optim: { lr: 1e-2, weight_decay: 0.01 },
        seed: 5,
      });
      const { ids, attention, response, tensor } = rolloutBatch({
        T: 12,
        lengths: [12, 9, 11],
        prompts: [4, 3, 5],
        seed: 7,
        holeLength: 0,
      });
      const inputs = await writeBatchFile([
        tensor("input_ids", ids),
        tensor("attention_mask", attention),
      ]);
      const lpOut = join(dir, "lp.safetensors");
      await ranks.ok("log_probs", { batch: inputs, out: lpOut });
      const old = get(await readFloats(lpOut), "log_probs");
      const batch = await writeBatchFile([
        tensor("input_ids", ids),
        tensor("attention_mask", attention),
        tensor("response_mask", response),
        tensor("old_log_probs", old),
        tensor("ref_log_probs", old),
        tensor(
          "advantages",
          Float32Array.from(old, (_, i) => Math.sin(i)),
        ),
      ]);
      await ranks.ok("update_actor", { batch, ppo_mini_batch_size: 3 });
      await ranks.ok("save_checkpoint", { dir: ckpt });
      await ranks.ok("export", { out: exported, dtype: "fp32" });
    } finally {
      await ranks.close();
    }
    const saved = await readFloats(join(ckpt, "adapter", "adapter_model.safetensors"));
    const start = await readFloats(join(LORA, "adapter", "adapter_model.safetensors"));
    const key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    expect(maxAbsDiff(get(saved, key), get(start, key)), "the adapter was trained").toBeGreaterThan(
      0,
    );
    // Without --hf-base: the checkpoint's base_model_name_or_path, the policy's folder.
    const out = join(dir, "merged");
    const r = convert(join(ckpt, "adapter"), out);
    expect(r.code, r.stderr).toBe(0);
    const ours = await readFloats(join(out, "model.safetensors"));
    const theirs = await readFloats(join(exported, "model.safetensors"));
    expect([...ours.keys()].sort()).toEqual([...theirs.keys()].sort());
    for (const [name, values] of ours) expect(sameBits(values, get(theirs, name)), name).toBe(true);
  });

  it("a bf16 base stays bf16: the merge rounded once to float32, then to bf16", async () => {
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
    const ref = await readSafetensors(join(PEFT, "expected.safetensors"));
    let targeted = 0;
    let peftDiffer = 0;
    for (const [name, t] of merged) {
      expect(t.dtype, name).toBe("BF16");
      const want = ref.get(`bf16.${name}`);
      if (want === undefined) {
        expect(t.data, name).toEqual(get(base, name).data);
        continue;
      }
      targeted++;
      expect(want.dtype).toBe("BF16");
      expect(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength)).toEqual(
        Buffer.from(want.data.buffer, want.data.byteOffset, want.data.byteLength),
      );
      // PEFT's bf16 merge (a float32 delta added in place): one bf16 rounding apart at most.
      const peft = ref.get(`peft-bf16.${name}`);
      if (peft) {
        const [a, b] = [t.data as Uint16Array, peft.data as Uint16Array];
        for (let i = 0; i < a.length; i++) {
          if (a[i] !== b[i]) {
            peftDiffer++;
            expect(Math.abs((a[i] as number) - (b[i] as number)), name).toBe(1);
          }
        }
      }
    }
    expect(targeted).toBe(14);
    expect(peftDiffer).toBeLessThan(10);
  });

  it("selects modules as PEFT does: all-linear, a regex, layers_to_transform; fan_in_fan_out is off for Linear", async () => {
    const dir = tempDir();
    const reference = join(dir, "reference");
    expect(convert(join(LORA, "adapter"), reference, "--hf-base", BASE).code).toBe(0);
    const want = readFileSync(join(reference, "model.safetensors"));
    const edits: Record<string, (c: Record<string, unknown>) => void> = {
      "all-linear": (c) => {
        c.target_modules = "ALL-LINEAR";
      },
      regex: (c) => {
        c.target_modules = String.raw`model\.layers\.\d+\.(self_attn|mlp)\.[a-z]+_proj`;
      },
      layers: (c) => {
        c.layers_to_transform = [0, 1];
        c.layers_pattern = "layers";
      },
      "full-names": (c) => {
        c.target_modules = [0, 1].flatMap((l) =>
          ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
            .concat(["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])
            .map((m) => `model.layers.${l}.${m}`),
        );
      },
      // PEFT sets fan_in_fan_out to false for a torch.nn.Linear (dispatch_default).
      "fan-in-fan-out": (c) => {
        c.fan_in_fan_out = true;
      },
      // verl's lora_adapter/adapter_config.json: asdict(LoraConfig), every field at its default.
      "verl-asdict": (c) => {
        Object.assign(c, {
          exclude_modules: null,
          layers_to_transform: null,
          layers_pattern: null,
          rank_pattern: {},
          alpha_pattern: {},
          modules_to_save: null,
          loftq_config: {},
          eva_config: null,
          use_dora: false,
          layer_replication: null,
          runtime_config: { ephemeral_gpu_offload: false },
          lora_bias: false,
          target_parameters: null,
          trainable_token_indices: null,
          alora_invocation_tokens: null,
          use_qalora: false,
        });
      },
    };
    for (const [tag, edit] of Object.entries(edits)) {
      const copy = join(dir, tag);
      cpSync(join(LORA, "adapter"), copy, { recursive: true });
      const file = join(copy, "adapter_config.json");
      const config = JSON.parse(readFileSync(file, "utf8"));
      edit(config);
      writeFileSync(file, JSON.stringify(config));
      const out = join(dir, `out-${tag}`);
      const r = convert(copy, out, "--hf-base", BASE);
      expect(r.code, `${tag}: ${r.stderr}`).toBe(0);
      expect(readFileSync(join(out, "model.safetensors")).equals(want), tag).toBe(true);
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
        /adapter_config\.json: use_dora is set \(true\): DoRA/,
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
      [
        adapter("one-module", (c) => {
          c.target_modules = ["q_proj"];
        }),
        ["--hf-base", BASE],
        1,
        /lora_A\.weight adapts model\.layers\.0\.self_attn\.k_proj, but target_modules \["q_proj"\] does not select it \(.*adapter_config\.json\); PEFT would not load it/,
      ],
      [
        adapter("layers", (c) => {
          c.layers_to_transform = [0];
        }),
        ["--hf-base", BASE],
        1,
        /adapts model\.layers\.1\.self_attn\.q_proj, but target_modules .* with layers_to_transform \[0\] does not select it/,
      ],
      [
        adapter("exclude", (c) => {
          c.exclude_modules = ["down_proj"];
        }),
        ["--hf-base", BASE],
        1,
        /adapts model\.layers\.0\.mlp\.down_proj, but exclude_modules \["down_proj"\] excludes it/,
      ],
      [
        adapter("python-regex", (c) => {
          c.target_modules = "(?P<m>.*)_proj";
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: target_modules "\(\?P<m>\.\*\)_proj" is not a regex read here/,
      ],
      [
        adapter("lora-bias", (c) => {
          c.lora_bias = true;
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: lora_bias is set \(true\): lora_B's bias/,
      ],
      [
        adapter("saved", (c) => {
          c.modules_to_save = ["lm_head"];
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: modules_to_save is set \(\["lm_head"\]\)/,
      ],
      [
        adapter("bias", (c) => {
          c.bias = "all";
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: bias is "all": only "none"/,
      ],
      [
        adapter("pattern", (c) => {
          c.rank_pattern = { q_proj: 8 };
        }),
        ["--hf-base", BASE],
        1,
        /adapter_config\.json: rank_pattern is set/,
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
