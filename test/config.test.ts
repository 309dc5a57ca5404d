import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { CONFIG_SPECS } from "../src/config/registry.js";
import {
  type CommandConfigSpec,
  jsonSchemaOf,
  resolveConfig,
  resolveConfigDraft,
} from "../src/config/resolve.js";
import { nodeAt, typeName } from "../src/config/schema-walk.js";
import { convertCkptSpec } from "../src/config/schemas/convert-ckpt.js";
import { trainSpec } from "../src/config/schemas/train.js";
import { usageErrorOf } from "./helpers/usage-error.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-config-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, text: string): string {
  const path = join(dir, name);
  mkdirSync(join(path, ".."), { recursive: true });
  writeFileSync(path, text);
  return path;
}

const spec: CommandConfigSpec = {
  command: "demo",
  schema: z.strictObject({
    name: z.string().default("base"),
    count: z.number().int().default(1),
    flag: z.boolean().default(false),
    items: z.array(z.string()).default([]),
    ratio: z.number().nullable().default(0.5),
    mode: z.enum(["a", "b"]).default("a"),
    nested: z
      .strictObject({
        lr: z.number().default(1e-6),
        deep: z.strictObject({ k: z.number().default(3) }).prefault({}),
      })
      .prefault({}),
  }),
  env: { DEMO_COUNT: "count", DEMO_LR: "nested.lr" },
};

describe("config precedence", () => {
  it("uses schema defaults when nothing is given", () => {
    expect(resolveConfig(spec)).toEqual({
      name: "base",
      count: 1,
      flag: false,
      items: [],
      ratio: 0.5,
      mode: "a",
      nested: { lr: 1e-6, deep: { k: 3 } },
    });
  });

  it("orders defaults < file < env < flags < overrides", () => {
    const cfg = file(
      "prec.yaml",
      "name: fromfile\ncount: 2\nnested:\n  lr: 0.1\n  deep:\n    k: 4\n",
    );
    const only = (extra: object) =>
      resolveConfig(spec, { configFile: cfg, ...extra }) as Record<string, unknown>;
    expect(only({})).toMatchObject({
      name: "fromfile",
      count: 2,
      nested: { lr: 0.1, deep: { k: 4 } },
    });
    const env = { DEMO_COUNT: "3", DEMO_LR: "0.2" };
    expect(only({ env })).toMatchObject({ count: 3, nested: { lr: 0.2, deep: { k: 4 } } });
    const cli = [{ key: "count", value: "4", origin: { kind: "flag" as const, flag: "--count" } }];
    expect(only({ env, cli })).toMatchObject({ count: 4, nested: { lr: 0.2 } });
    expect(only({ env, cli, overrides: ["count=5", "nested.deep.k=9"] })).toMatchObject({
      name: "fromfile",
      count: 5,
      nested: { lr: 0.2, deep: { k: 9 } },
    });
  });

  it("ignores empty environment variables", () => {
    expect(resolveConfig(spec, { env: { DEMO_COUNT: "" } })).toMatchObject({ count: 1 });
  });
});

describe("override coercion", () => {
  it("reads a tuple's items by their own types, from overrides and YAML alike", () => {
    const fromOverride = resolveConfig(trainSpec, {
      overrides: ["model.path=m", "actor.betas=[0.8, 0.99]"],
    });
    expect(fromOverride.actor.betas).toEqual([0.8, 0.99]);
    const dir = mkdtempSync(join(tmpdir(), "searchr1-tuple-"));
    try {
      const file = join(dir, "c.yaml");
      writeFileSync(file, 'model: {path: m}\nactor: {betas: ["0.7", 0.95]}\n');
      expect(resolveConfig(trainSpec, { configFile: file }).actor.betas).toEqual([0.7, 0.95]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("coerces numbers, booleans, lists, null and quoted strings by the schema's types", () => {
    const cfg = resolveConfig(spec, {
      overrides: [
        "count=12",
        "flag=true",
        "items=[a, 'b,c', d]",
        "ratio=null",
        "nested.lr=1e-6",
        'name="7"',
        "+mode=b",
      ],
    });
    expect(cfg).toMatchObject({
      count: 12,
      flag: true,
      items: ["a", "b,c", "d"],
      ratio: null,
      nested: { lr: 1e-6 },
      name: "7",
      mode: "b",
    });
  });

  it("accepts comma lists without brackets, an empty list, and yes/no booleans", () => {
    expect(resolveConfig(spec, { overrides: ["items=x,y", "flag=yes"] })).toMatchObject({
      items: ["x", "y"],
      flag: true,
    });
    expect(resolveConfig(spec, { overrides: ["items=[]", "flag=off"] })).toMatchObject({
      items: [],
      flag: false,
    });
  });

  it("keeps a string that looks numeric when the key is a string", () => {
    expect(resolveConfig(spec, { overrides: ["name=0012"] })).toMatchObject({ name: "0012" });
  });

  it("rejects text that is not key=value", () => {
    expect(usageErrorOf(() => resolveConfig(spec, { overrides: ["count"] }))).toContain(
      'override "count": expected key.path=value',
    );
  });
});

describe("YAML files", () => {
  it("follows extends relative to the extending file, several levels deep", () => {
    file("base/root.yaml", "name: root\ncount: 7\nitems: [r]\n");
    file("base/mid.yaml", "extends: root.yaml\nname: mid\n");
    const top = file("top.yaml", "extends: base/mid.yaml\nnested:\n  lr: 0.5\n");
    expect(resolveConfig(spec, { configFile: top })).toMatchObject({
      name: "mid",
      count: 7,
      items: ["r"],
      nested: { lr: 0.5 },
    });
  });

  it("merges a list of bases in order", () => {
    file("l1.yaml", "name: one\ncount: 1\n");
    file("l2.yaml", "name: two\n");
    const top = file("list.yaml", "extends: [l1.yaml, l2.yaml]\n");
    expect(resolveConfig(spec, { configFile: top })).toMatchObject({ name: "two", count: 1 });
  });

  it("reports an extends cycle and a missing base with the file that names it", () => {
    file("cyc-a.yaml", "extends: cyc-b.yaml\n");
    const b = file("cyc-b.yaml", "extends: cyc-a.yaml\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: b }))).toMatch(
      /extends cycle: .*cyc-b\.yaml -> .*cyc-a\.yaml -> .*cyc-b\.yaml/,
    );
    const m = file("missing-base.yaml", "extends: nowhere.yaml\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: m }))).toMatch(
      /file not found: .*nowhere\.yaml \(extended by .*missing-base\.yaml\)/,
    );
  });

  it("reports a missing config file, invalid YAML with line:col, and a non-mapping top level", () => {
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: join(dir, "nope.yaml") }))).toMatch(
      /config: file not found: .*nope\.yaml/,
    );
    const bad = file("bad.yaml", "name: ok\ncount: [1, 2\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: bad }))).toMatch(
      /bad\.yaml:\d+:\d+: invalid YAML/,
    );
    const list = file("list-top.yaml", "- a\n- b\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: list }))).toMatch(
      /list-top\.yaml: expected a mapping/,
    );
  });
});

describe("one coercion rule for every source", () => {
  /** The same key and text given in a YAML file, as an override and as a flag. */
  function everySource(key: string, yamlText: string, text: string) {
    const cfg = file(`coerce-${key}.yaml`, `${key}: ${yamlText}\n`);
    return [
      resolveConfig(spec, { configFile: cfg }),
      resolveConfig(spec, { overrides: [`${key}=${text}`] }),
      resolveConfig(spec, {
        cli: [{ key, value: text, origin: { kind: "flag", flag: `--${key}` } }],
      }),
    ].map((c) => (c as Record<string, unknown>)[key]);
  }

  it("takes a single value where a list is wanted, from a file as from a flag or an override", () => {
    expect(everySource("items", "test", "test")).toEqual([["test"], ["test"], ["test"]]);
    expect(everySource("items", "a,b", "a,b")).toEqual([
      ["a", "b"],
      ["a", "b"],
      ["a", "b"],
    ]);
    expect(everySource("items", "[a, b]", "[a,b]")).toEqual([
      ["a", "b"],
      ["a", "b"],
      ["a", "b"],
    ]);
    // A YAML number where a list of strings is wanted is that text, in a list.
    expect(everySource("items", "7", "7")).toEqual([["7"], ["7"], ["7"]]);
  });

  it("reads YAML strings as flags are read, and numbers as text where text is wanted", () => {
    expect(everySource("flag", "yes", "yes")).toEqual([true, true, true]);
    expect(everySource("count", '"3"', "3")).toEqual([3, 3, 3]);
    expect(everySource("name", "2024", "2024")).toEqual(["2024", "2024", "2024"]);
    expect(everySource("ratio", "null", "null")).toEqual([null, null, null]);
    // Nested keys and list elements are read by their own schema node.
    const nested = file("coerce-nested.yaml", 'nested:\n  lr: "1e-3"\n  deep:\n    k: "4"\n');
    expect(resolveConfig(spec, { configFile: nested }).nested).toEqual({
      lr: 1e-3,
      deep: { k: 4 },
    });
  });

  it("still reports what cannot be read with the file position", () => {
    const cfg = file("coerce-bad.yaml", "name: x\ncount: many\nmode: [a]\n");
    const lines = usageErrorOf(() => resolveConfig(spec, { configFile: cfg })).split("\n");
    expect(lines[0]).toMatch(/^"count" = "many" \(.*coerce-bad\.yaml:2:1\): expected integer$/);
    expect(lines[1]).toMatch(/^"mode" = \["a"\] \(.*coerce-bad\.yaml:3:1\): /);
  });

  it("accepts splits: test in a preprocess config file", () => {
    const cfg = file("splits.yaml", "datasets: nq\ninput: in\nout: out\nsplits: test\n");
    expect(
      resolveConfig(CONFIG_SPECS.preprocess as CommandConfigSpec, { configFile: cfg }),
    ).toMatchObject({
      datasets: ["nq"],
      splits: ["test"],
    });
  });
});

describe("errors name key, origin, expectation and a suggestion", () => {
  it("names the file position of a wrong type", () => {
    const cfg = file("wrong.yaml", "name: x\nnested:\n  lr: fast\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: cfg }))).toMatch(
      /^"nested\.lr" = "fast" \(.*wrong\.yaml:3:3\): expected number$/,
    );
  });

  it("names the env var, the flag and the override", () => {
    expect(usageErrorOf(() => resolveConfig(spec, { env: { DEMO_COUNT: "many" } }))).toBe(
      '"count" = "many" (env DEMO_COUNT): expected integer',
    );
    const cli = [{ key: "mode", value: "c", origin: { kind: "flag" as const, flag: "--mode" } }];
    expect(usageErrorOf(() => resolveConfig(spec, { cli }))).toBe(
      '"mode" = "c" (flag --mode): expected one of a|b',
    );
    expect(usageErrorOf(() => resolveConfig(spec, { overrides: ["count=1.5"] }))).toMatch(
      /^"count" = 1\.5 \(override count=1\.5\): /,
    );
  });

  it("suggests the nearest key for a typo in a file and in an override", () => {
    const cfg = file("typo.yaml", "nested:\n  lrr: 1\n");
    expect(usageErrorOf(() => resolveConfig(spec, { configFile: cfg }))).toMatch(
      /^unknown key "nested\.lrr" \(.*typo\.yaml:2:3\); did you mean "nested\.lr"\?$/,
    );
    expect(usageErrorOf(() => resolveConfig(spec, { overrides: ["nested.depp.k=1"] }))).toBe(
      'unknown key "nested.depp" (override nested.depp.k=1); did you mean "nested.deep"?',
    );
    expect(usageErrorOf(() => resolveConfig(spec, { overrides: ["lr=1"] }))).toBe(
      'unknown key "lr" (override lr=1); did you mean "nested.lr"?',
    );
  });

  it("lists valid keys when nothing is close", () => {
    expect(usageErrorOf(() => resolveConfig(spec, { overrides: ["zzzzzzzz=1"] }))).toBe(
      'unknown key "zzzzzzzz" (override zzzzzzzz=1); valid keys: name, count, flag, items, ratio, mode, nested',
    );
  });

  it("names a list element that has the wrong type", () => {
    expect(
      usageErrorOf(() =>
        resolveConfig(trainSpec, {
          overrides: ["model.path=m", "trainer.logger=[console,mlflow]"],
        }),
      ),
    ).toBe(
      '"trainer.logger[1]" = "mlflow" (override trainer.logger=[console,mlflow]): expected one of console|jsonl|plot|wandb|tensorboard',
    );
  });

  it("reports every problem at once, and missing required keys with how to set them", () => {
    const msg = usageErrorOf(() =>
      resolveConfig(trainSpec, {
        overrides: ["actor.lr=abc", "rollout.n=0"],
        flagNames: { "model.path": "--model" },
      }),
    );
    const lines = msg.split("\n");
    expect(lines).toContain(
      'missing required key "model.path": expected string (set it with --model, "model.path:" in --config FILE, model.path=...)',
    );
    expect(lines).toContain('"actor.lr" = "abc" (override actor.lr=abc): expected number');
    expect(lines.some((l) => l.startsWith('"rollout.n" = 0 (override rollout.n=0): '))).toBe(true);
    expect(lines).toHaveLength(3);
  });
});

describe("a draft config for display (searchr1 config)", () => {
  const withRequired: CommandConfigSpec = {
    command: "demo",
    schema: z.strictObject({
      model: z.strictObject({
        path: z.string().min(1).describe("model folder"),
        dtype: z.enum(["bf16", "fp32"]).default("bf16"),
      }),
      mode: z.enum(["a", "b"]),
      count: z.number().int().default(1),
    }),
    env: {},
  };

  it("resolves every default and leaves required keys that nothing sets null, listing them", () => {
    expect(resolveConfigDraft(withRequired, { overrides: ["count=3"] })).toEqual({
      values: { model: { path: null, dtype: "bf16" }, mode: null, count: 3 },
      missing: [["model", "path"], ["mode"]],
    });
    expect(resolveConfigDraft(withRequired, { overrides: ["model.path=m", "mode=b"] })).toEqual({
      values: { model: { path: "m", dtype: "bf16" }, mode: "b", count: 1 },
      missing: [],
    });
  });

  it("is still an error for anything but a missing key, as for the run", () => {
    const msg = usageErrorOf(() => resolveConfigDraft(withRequired, { overrides: ["count=x"] }));
    expect(msg).toContain('"count" = "x" (override count=x): expected integer');
    expect(() => resolveConfig(withRequired, { overrides: ["mode=a"] })).toThrow(
      /missing required key "model.path"/,
    );
  });
});

describe("train and eval schemas", () => {
  it("default to Search-R1's published values", () => {
    const cfg = resolveConfig(trainSpec, { overrides: ["model.path=/models/qwen2.5-3b"] });
    expect(cfg.algorithm.name).toBe("grpo");
    expect(cfg.data).toMatchObject({
      train_batch_size: 512,
      val_batch_size: 256,
      max_prompt_length: 4096,
      max_start_length: 2048,
      max_response_length: 500,
      max_obs_length: 500,
    });
    expect(cfg.actor).toMatchObject({
      lr: 1e-6,
      lr_warmup_steps_ratio: 0.285,
      ppo_mini_batch_size: 256,
      ppo_micro_batch_size: 64,
      clip_ratio: 0.2,
      kl_loss_type: "low_var_kl",
      kl_loss_coef: 0.001,
      entropy_coeff: 0.001,
      grad_clip: 1,
      state_masking: true,
    });
    expect(cfg.critic).toMatchObject({
      lr: 1e-5,
      lr_warmup_steps_ratio: 0.015,
      cliprange_value: 0.5,
    });
    expect(cfg.rollout).toMatchObject({ n: 5, max_turns: 4, temperature: 1, top_p: 1 });
    expect(cfg.retriever).toMatchObject({ url: "http://127.0.0.1:8000/retrieve", topk: 3 });
    // Search-R1's scripts use 8 GPUs; this build trains on one, and says so for more.
    expect(cfg.trainer).toMatchObject({
      gpus: 1,
      save_freq: 100,
      test_freq: 100,
      total_training_steps: 1005,
    });
  });

  it("eval decodes greedily by default; --sample samples at the training temperature", () => {
    const resolve = (overrides: string[]) =>
      resolveConfig(CONFIG_SPECS.eval as CommandConfigSpec, {
        overrides: ["model.path=m", ...overrides],
      }) as { rollout: { do_sample: boolean; temperature: number } };
    expect(resolve([]).rollout).toMatchObject({ do_sample: false });
    expect(resolve(["rollout.do_sample=true"]).rollout).toMatchObject({
      do_sample: true,
      temperature: 1,
    });
  });

  it("every command has a JSON Schema that forbids unknown keys", () => {
    for (const s of Object.values(CONFIG_SPECS)) {
      const js = jsonSchemaOf(s) as { type: string; additionalProperties: boolean; title: string };
      expect(js.type).toBe("object");
      expect(js.additionalProperties).toBe(false);
      expect(js.title).toBe(`searchr1 ${s.command} config`);
    }
  });
});

describe("dtype spellings (one printed, every one read)", () => {
  const convert = convertCkptSpec as unknown as CommandConfigSpec;
  const required = ["kind=native-to-hf", "input=in", "out=out"];
  const dtypeOf = (input: Parameters<typeof resolveConfig>[1]) =>
    (resolveConfig(convert, input) as { dtype: string }).dtype;

  it.each([
    ["bf16", "bf16"],
    ["bfloat16", "bf16"],
    ["BF16", "bf16"],
    ["fp16", "fp16"],
    ["float16", "fp16"],
    ["f16", "fp16"],
    ["fp32", "fp32"],
    ["float32", "fp32"],
    ["F32", "fp32"],
    ["keep", "keep"],
  ])("reads convert's dtype %s as %s from a file, a flag and an override", (text, want) => {
    const cfg = file(`dtype-${text}.yaml`, `dtype: ${text}\n`);
    expect(dtypeOf({ configFile: cfg, overrides: required })).toBe(want);
    const flag = { key: "dtype", value: text, origin: { kind: "flag" as const, flag: "--dtype" } };
    expect(dtypeOf({ cli: [flag], overrides: required })).toBe(want);
    expect(dtypeOf({ overrides: [...required, `dtype=${text}`] })).toBe(want);
  });

  it("reads train's model.dtype the same way", () => {
    const cfg = resolveConfig(trainSpec, { overrides: ["model.path=m", "model.dtype=bfloat16"] });
    expect(cfg.model.dtype).toBe("bf16");
  });

  it("prints bf16|fp16|fp32 in errors, help types and the JSON Schema", () => {
    expect(
      usageErrorOf(() => resolveConfig(convert, { overrides: [...required, "dtype=int8"] })),
    ).toBe('"dtype" = "int8" (override dtype=int8): expected one of keep|bf16|fp16|fp32');
    expect(typeName(nodeAt(convert.schema, ["dtype"]) as z.ZodType)).toBe(
      "one of keep|bf16|fp16|fp32",
    );
    const js = jsonSchemaOf(convert) as { properties: { dtype: { enum: string[] } } };
    expect(js.properties.dtype.enum).toEqual(["keep", "bf16", "fp16", "fp32"]);
  });
});
