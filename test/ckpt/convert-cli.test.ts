import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { readSafetensors, type Tensor } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { pickleBytes, str, tensorOps, writeTorchFile } from "./handmade.js";

const F = fileURLToPath(new URL("./fixtures", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "searchr1-convert-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Every tensor of a HF folder, read with the plain safetensors reader and the index. */
async function readFolder(folder: string): Promise<Map<string, Tensor>> {
  const index = join(folder, "model.safetensors.index.json");
  const files = existsSync(index)
    ? [
        ...new Set(
          Object.values(
            JSON.parse(readFileSync(index, "utf8")).weight_map as Record<string, string>,
          ),
        ),
      ]
    : ["model.safetensors"];
  const all = new Map<string, Tensor>();
  for (const f of files) for (const [k, v] of await readSafetensors(join(folder, f))) all.set(k, v);
  return all;
}

async function expectSameTensors(out: string, reference: Map<string, Tensor>) {
  const got = await readFolder(out);
  expect([...got.keys()].sort()).toEqual([...reference.keys()].sort());
  for (const [name, want] of reference) {
    const t = got.get(name) as Tensor;
    expect({ name, dtype: t.dtype, shape: t.shape }).toEqual({
      name,
      dtype: want.dtype,
      shape: want.shape,
    });
    const a = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    const b = Buffer.from(want.data.buffer, want.data.byteOffset, want.data.byteLength);
    expect(a.equals(b), `${name} differs`).toBe(true);
  }
}

/** `searchr1 convert megatron-to-hf --input … --hf-base … --out … [extra]`. */
const megatron = (input: string, base: string, out: string, ...extra: string[]) =>
  runCli([
    "convert",
    "megatron-to-hf",
    "--input",
    input,
    "--hf-base",
    base,
    "--out",
    out,
    ...extra,
  ]);

const MEGATRON: [string, string][] = [
  ["tp1-pp1-te-untied", "untied"],
  ["tp2-pp1-te-untied", "untied"],
  ["tp1-pp2-plain-tied", "tied"],
  ["tp2-pp2-te-tied", "tied"],
  ["tp2-pp2-plain-untied", "untied"],
  ["tp2-pp1-te-llama", "llama"],
  ["tp2-pp1-te-tied", "tied"],
];

describe("searchr1 convert megatron-to-hf", () => {
  it.each(MEGATRON)("%s gives the %s model back, bit for bit", async (c, base) => {
    const out = join(dir, `m-${c}`);
    const r = megatron(join(F, "megatron", c), join(F, "hf", base), out, "--max-shard-size", "8KB");
    expect(r.code).toBe(0);
    expect(r.stderr).not.toContain("warning");
    expect(r.stdout).toMatch(
      new RegExp(`^${out}: \\d+ tensors, .* file\\(s\\) from .*iter_0000300`),
    );
    await expectSameTensors(out, await readFolder(join(F, "hf", base)));
    // Config and tokenizer come from the base folder unchanged; the shards have an index.
    for (const f of [
      "config.json",
      "tokenizer.json",
      "tokenizer_config.json",
      "generation_config.json",
    ]) {
      expect(readFileSync(join(out, f))).toEqual(readFileSync(join(F, "hf", base, f)));
    }
    const index = JSON.parse(readFileSync(join(out, "model.safetensors.index.json"), "utf8"));
    expect(Object.keys(index.weight_map).length).toBeGreaterThan(10);
    expect(readdirSync(out).filter((f) => f.endsWith(".safetensors")).length).toBeGreaterThan(1);
  });

  it("--verify prints one row per tensor against config.json", () => {
    const r = megatron(
      join(F, "megatron", "tp2-pp2-te-tied"),
      join(F, "hf", "tied"),
      join(dir, "verify"),
      "--verify",
      "--quiet",
    );
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/model\.layers\.3\.self_attn\.q_proj\.bias\s+\[16\]\s+BF16\s+ok/);
    expect(r.stdout).not.toMatch(/lm_head/);
  });

  it("a config that does not fit the checkpoint is an error, and nothing is written", () => {
    const out = join(dir, "wrong-base");
    const r = megatron(
      join(F, "megatron", "tp2-pp1-te-llama"),
      join(F, "hf", "untied"),
      out,
      "--verify",
    );
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/q_proj\.bias\s+\[16\]\s+missing/);
    expect(r.stderr).toMatch(/tensor\(s\) do not match what .*hf\/untied\/config\.json implies/);
    expect(existsSync(out)).toBe(false);
  });

  it("an untied checkpoint with a tied config is refused, not silently truncated", () => {
    const out = join(dir, "tied-mismatch");
    const r = megatron(join(F, "megatron", "tp2-pp2-plain-untied"), join(F, "hf", "tied"), out);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("output_layer.weight differs from the embedding");
    expect(existsSync(out)).toBe(false);
  });

  it("names a missing rank file", () => {
    const copy = join(dir, "missing-rank");
    cpSync(join(F, "megatron", "tp2-pp2-te-tied"), copy, { recursive: true });
    rmSync(join(copy, "iter_0000300", "mp_rank_01_001"), { recursive: true });
    const r = megatron(copy, join(F, "hf", "tied"), join(dir, "x"));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `${join(copy, "iter_0000300", "mp_rank_01_001")}: missing (tensor-parallel size 2, pipeline size 2)`,
    );
  });

  it("names an unknown parameter and refuses a hostile pickle, exiting 1", () => {
    const root = join(dir, "handmade", "iter_0000001", "mp_rank_00");
    mkdirSync(root, { recursive: true });
    const pkl = pickleBytes(
      "}",
      str("model"),
      "}",
      str("decoder.layers.0.mystery.weight"),
      tensorOps("0", 1, 0, [1], [1]),
      "ss",
    );
    writeTorchFile(join(root, "model_optim_rng.pt"), pkl, { "0": Buffer.alloc(4) });
    const run = () => megatron(join(dir, "handmade"), join(F, "hf", "untied"), join(dir, "y"));
    const r = run();
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("unknown parameter name decoder.layers.0.mystery.weight");
    writeTorchFile(
      join(root, "model_optim_rng.pt"),
      pickleBytes("cos\nsystem\n", str("echo hi"), "\x85R"),
    );
    const h = run();
    expect(h.code).toBe(1);
    expect(h.stderr).toContain("refusing global os.system");
    expect(h.stdout).toBe("");
  });

  it("names the rank whose shard does not match rank 0's shape", () => {
    const iter = join(dir, "mismatch", "iter_0000001");
    const norm = (n: number) =>
      pickleBytes(
        "}",
        str("model"),
        "}",
        str("decoder.final_layernorm.weight"),
        tensorOps("0", n, 0, [n], [1]),
        "ss",
      );
    for (const [t, n] of [
      [0, 2],
      [1, 3],
    ]) {
      mkdirSync(join(iter, `mp_rank_0${t}`), { recursive: true });
      writeTorchFile(join(iter, `mp_rank_0${t}`, "model_optim_rng.pt"), norm(n as number), {
        "0": Buffer.alloc(12),
      });
    }
    const r = megatron(join(dir, "mismatch"), join(F, "hf", "untied"), join(dir, "v"));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `${join(iter, "mp_rank_01", "model_optim_rng.pt")}: decoder.final_layernorm.weight has shape [3], rank 0 has [2]`,
    );
  });

  it("requires --hf-base and refuses to overwrite an existing folder", () => {
    const input = join(F, "megatron", "tp1-pp1-te-untied");
    const noBase = runCli(["convert", "megatron-to-hf", "--input", input, "--out", join(dir, "z")]);
    expect(noBase.code).toBe(2);
    expect(noBase.stderr).toContain("--hf-base is required");
    const out = join(dir, "exists");
    const run = (...extra: string[]) =>
      megatron(input, join(F, "hf", "untied"), out, "--quiet", ...extra);
    expect(run().code).toBe(0);
    const again = run();
    expect(again.code).toBe(2);
    expect(again.stderr).toContain(`${out}: already exists; pass --overwrite to replace it`);
    expect(run("--overwrite").code).toBe(0);
  });
});

describe("searchr1 convert fsdp-to-hf", () => {
  it.each([
    ["ws1-tied", "tied"],
    ["ws2-dtensor-untied", "untied"],
  ])("%s (from the checkpoint root) gives the %s model back, bit for bit", async (c, base) => {
    const out = join(dir, `f-${c}`);
    const r = runCli(["convert", "fsdp-to-hf", "--input", join(F, "fsdp", c), "--out", out]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`world size ${c.startsWith("ws1") ? 1 : 2}`);
    await expectSameTensors(out, await readFolder(join(F, "hf", base)));
    expect(readFileSync(join(out, "config.json"))).toEqual(
      readFileSync(join(F, "fsdp", c, "global_step_300", "actor", "huggingface", "config.json")),
    );
  });

  // make_fsdp_lora_fixture.py: a LoRA run's checkpoint under PEFT's names, 2 ranks, with the
  // lora_adapter/ folder verl writes beside the rank files.
  it("a LoRA run's checkpoint: the adapters merged into the base, bit for bit PEFT's merge", async () => {
    const lora = join(F, "fsdp", "ws2-lora-untied");
    const out = join(dir, "f-lora");
    const r = runCli(["convert", "fsdp-to-hf", "--input", lora, "--out", out, "--quiet"]);
    expect(r.code, r.stderr).toBe(0);
    await expectSameTensors(out, await readSafetensors(join(lora, "expected.safetensors")));

    const copy = join(dir, "fsdp-lora-no-adapter");
    cpSync(lora, copy, { recursive: true });
    rmSync(join(copy, "global_step_300", "actor", "lora_adapter"), { recursive: true });
    const missing = runCli(["convert", "fsdp-to-hf", "--input", copy, "--out", join(dir, "x")]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(
      /holds LoRA adapters, but .*lora_adapter\/adapter_config\.json \(their lora_alpha/,
    );
    expect(existsSync(join(dir, "x"))).toBe(false);

    // An adapter on a module the lora_adapter/ config does not select: the two disagree.
    const narrow = join(dir, "fsdp-lora-narrow");
    cpSync(lora, narrow, { recursive: true });
    const configFile = join(
      narrow,
      "global_step_300",
      "actor",
      "lora_adapter",
      "adapter_config.json",
    );
    const config = JSON.parse(readFileSync(configFile, "utf8"));
    writeFileSync(configFile, JSON.stringify({ ...config, target_modules: ["q_proj", "v_proj"] }));
    const refused = runCli(["convert", "fsdp-to-hf", "--input", narrow, "--out", join(dir, "x")]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /model\.layers\.0\.mlp\.down_proj\.weight: has an adapter, but target_modules \["q_proj","v_proj"\] does not select it \(.*lora_adapter\/adapter_config\.json\)/,
    );
    expect(existsSync(join(dir, "x"))).toBe(false);
  });

  // verl's model_merger (verl/model_merger/base_model_merger.py, save_lora_adapter): the base
  // unmerged, the adapter as a PEFT folder in <out>/lora_adapter.
  it("--lora separate: the base unmerged and the adapter apart, which peft-to-hf merges to the same", async () => {
    const lora = join(F, "fsdp", "ws2-lora-untied");
    const actor = join(lora, "global_step_300", "actor");
    const out = join(dir, "f-lora-separate");
    const r = runCli([
      "convert",
      "fsdp-to-hf",
      "--input",
      lora,
      "--out",
      out,
      "--lora",
      "separate",
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(
      `${join(out, "lora_adapter")}: the LoRA adapter apart (rank 2, 24 tensors`,
    );
    await expectSameTensors(out, await readFolder(join(F, "hf", "untied")));
    expect(readFileSync(join(out, "lora_adapter", "adapter_config.json"))).toEqual(
      readFileSync(join(actor, "lora_adapter", "adapter_config.json")),
    );
    const ours = await readSafetensors(join(out, "lora_adapter", "adapter_model.safetensors"));
    const verls = await readSafetensors(join(actor, "lora_adapter", "adapter_model.safetensors"));
    expect([...ours.keys()].sort()).toEqual([...verls.keys()].sort());
    for (const [name, t] of verls) {
      expect(ours.get(name)?.dtype, name).toBe(t.dtype);
      expect(ours.get(name)?.data, name).toEqual(t.data);
    }
    const merged = join(dir, "f-lora-separate-merged");
    const m = runCli([
      "convert",
      "peft-to-hf",
      "--input",
      join(out, "lora_adapter"),
      "--hf-base",
      out,
      "--out",
      merged,
      "--quiet",
    ]);
    expect(m.code, m.stderr).toBe(0);
    await expectSameTensors(merged, await readSafetensors(join(lora, "expected.safetensors")));

    const plain = runCli([
      "convert",
      "fsdp-to-hf",
      "--input",
      join(F, "fsdp", "ws2-dtensor-untied"),
      "--out",
      join(dir, "y"),
      "--lora",
      "separate",
    ]);
    expect(plain.code).toBe(2);
    expect(plain.stderr).toMatch(/--lora separate: .*actor holds no LoRA adapters/);
    const other = runCli([
      "convert",
      "native-to-hf",
      "--input",
      join(F, "hf", "untied"),
      "--out",
      join(dir, "y"),
      "--lora",
      "separate",
    ]);
    expect(other.code).toBe(2);
    expect(other.stderr).toContain("convert native-to-hf: --lora separate is for fsdp-to-hf");
    expect(existsSync(join(dir, "y"))).toBe(false);
  });

  it("names a missing rank file", () => {
    const copy = join(dir, "fsdp-missing");
    cpSync(join(F, "fsdp", "ws2-dtensor-untied"), copy, { recursive: true });
    const gone = join(copy, "global_step_300", "actor", "model_world_size_2_rank_1.pt");
    rmSync(gone);
    const r = runCli(["convert", "fsdp-to-hf", "--input", copy, "--out", join(dir, "w")]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${gone}: missing (world size 2)`);
  });
});

describe("searchr1 convert native-to-hf", () => {
  it.each([
    ["untied", "bf16", "untied-bf16"],
    ["untied", "fp16", "untied-fp16"],
    ["tied", "fp32", "tied-fp32"],
  ])("%s --dtype %s matches PyTorch's cast bit for bit", async (base, dtype, cast) => {
    const out = join(dir, `n-${cast}`);
    const r = runCli([
      "convert",
      "native-to-hf",
      "--input",
      join(F, "hf", base),
      "--out",
      out,
      "--dtype",
      dtype,
    ]);
    expect(r.code).toBe(0);
    await expectSameTensors(out, await readSafetensors(join(F, "cast", `${cast}.safetensors`)));
    // config.json's torch_dtype is set to the written dtype (so transformers loads it so),
    // every other byte as the base model wrote it; stdout says so.
    const name = { bf16: "bfloat16", fp16: "float16", fp32: "float32" }[dtype] as string;
    const baseText = readFileSync(join(F, "hf", base, "config.json"), "utf8");
    const was = JSON.parse(baseText).torch_dtype as string;
    expect(readFileSync(join(out, "config.json"), "utf8")).toBe(
      baseText.replace(`"torch_dtype": "${was}"`, `"torch_dtype": "${name}"`),
    );
    expect(r.stdout).toContain(
      `${join(out, "config.json")}: torch_dtype set to ${name} (was ${was}) to match the tensors; --keep-config keeps the base model's`,
    );
    expect(r.stderr).not.toContain("warning");
  });

  it("--keep-config copies config.json unchanged and warns that it disagrees", () => {
    const out = join(dir, "n-keep-config");
    const input = join(F, "hf", "untied");
    const r = runCli(
      ["convert", "native-to-hf", "--input", input, "--out", out].concat([
        "--dtype",
        "bf16",
        "--keep-config",
      ]),
    );
    expect(r.code).toBe(0);
    expect(readFileSync(join(out, "config.json"))).toEqual(
      readFileSync(join(input, "config.json")),
    );
    expect(r.stderr).toMatch(
      /warning: .*config\.json: tensors are BF16 but config\.json says torch_dtype float32; transformers will load them as float32 \(--keep-config\)/,
    );
    expect(r.stdout).not.toContain("set to");
  });

  it("sets transformers 5's `dtype` field (and both, where a config has both)", () => {
    for (const fields of [["dtype"], ["dtype", "torch_dtype"]]) {
      const base = join(dir, `base-${fields.join("-")}`);
      cpSync(join(F, "hf", "untied"), base, { recursive: true });
      const config = JSON.parse(readFileSync(join(base, "config.json"), "utf8"));
      delete config.torch_dtype;
      for (const f of fields) config[f] = "float32";
      writeFileSync(join(base, "config.json"), JSON.stringify(config, null, 2));
      const out = join(dir, `n-${fields.join("-")}`);
      const r = runCli([
        "convert",
        "native-to-hf",
        "--input",
        base,
        "--out",
        out,
        "--dtype",
        "bf16",
      ]);
      expect(r.code).toBe(0);
      const written = JSON.parse(readFileSync(join(out, "config.json"), "utf8"));
      for (const f of fields) expect(written[f]).toBe("bfloat16");
      expect("torch_dtype" in written).toBe(fields.includes("torch_dtype"));
      for (const f of fields) expect(r.stdout).toContain(`${f} set to bfloat16 (was float32)`);
    }
  });

  it("reads torch's dtype names as the short ones: --dtype bfloat16 is --dtype bf16", async () => {
    const out = join(dir, "n-bfloat16");
    const r = runCli(
      ["convert", "native-to-hf", "--input", join(F, "hf", "untied")].concat([
        "--out",
        out,
        "--dtype",
        "bfloat16",
      ]),
    );
    expect(r.code).toBe(0);
    await expectSameTensors(out, await readSafetensors(join(F, "cast", "untied-bf16.safetensors")));
    const bad = runCli([
      "convert",
      "native-to-hf",
      "--input",
      "x",
      "--out",
      "y",
      "--dtype",
      "int8",
    ]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("expected one of keep|bf16|fp16|fp32");
  });

  it("--verify lists the dtype each tensor is written in, not the checkpoint's", () => {
    const r = runCli([
      "convert",
      "native-to-hf",
      "--input",
      join(F, "hf", "untied"),
      "--out",
      join(dir, "n-verify-bf16"),
      "--dtype",
      "bf16",
      "--verify",
      "--quiet",
    ]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/model\.embed_tokens\.weight\s+\[32, 16\]\s+BF16\s+ok/);
    expect(r.stdout).not.toMatch(/\bF32\b/);
  });
});
