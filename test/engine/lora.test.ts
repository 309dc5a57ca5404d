import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readSafetensors, writeSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { expectJsonError, request } from "../helpers/http.js";
import {
  generateOk,
  type Output,
  type RunningEngine,
  startEngine,
  teacherForced,
} from "./helpers.js";

const NATIVE = fileURLToPath(new URL("../native/fixtures/", import.meta.url));
const MODEL = join(NATIVE, "untied");
const ADAPTER = join(NATIVE, "lora/adapter"); // every linear layer, r 4
const RSLORA = join(NATIVE, "lora/rslora"); // q/v/up/down, r 8, rsLoRA

// 40 tokens: two full KV blocks of 16 that the prefix cache can hold.
const PROMPTS = [
  Array.from({ length: 40 }, (_, i) => (i * 37 + 5) % 500),
  Array.from({ length: 21 }, (_, i) => (i * 11 + 3) % 500),
];
const GREEDY = { temperature: 0, max_new_tokens: 16, ignore_eos: true };

let dir: string;
let served: RunningEngine;
let merged: RunningEngine;

const post = (base: string, path: string, body: unknown) =>
  request(base, "POST", path, JSON.stringify(body));

async function greedy(base: string, ids: number[], lora?: string | null): Promise<Output> {
  return generateOk<Output>(base, {
    input_ids: ids,
    sampling_params: GREEDY,
    return_logprob: true,
    ...(lora !== undefined ? { lora_path: lora } : {}),
  });
}

const logprobs = (o: Output) => (o.meta_info.output_token_logprobs ?? []).map((t) => t[0]);

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "searchr1-engine-lora-"));
  const convert = runCli([
    "convert",
    "peft-to-hf",
    "--input",
    ADAPTER,
    "--hf-base",
    MODEL,
    "--out",
    join(dir, "merged"),
    "--quiet",
  ]);
  expect(convert.code, convert.stderr).toBe(0);
  [served, merged] = await Promise.all([
    startEngine(["--model", MODEL, "--skip-tokenizer-init", "--lora", `a=${ADAPTER}`]),
    startEngine(["--model", join(dir, "merged"), "--skip-tokenizer-init"]),
  ]);
}, 120_000);

afterAll(async () => {
  await Promise.all([served?.stop(), merged?.stop()]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("serve-engine with LoRA adapters", () => {
  it("generates with the adapter unmerged what the merged model generates, token for token, and the trainer scores those tokens alike", async () => {
    for (const prompt of PROMPTS) {
      const withAdapter = await greedy(served.base, prompt, "a");
      const fromMerged = await greedy(merged.base, prompt);
      const base = await greedy(served.base, prompt);
      expect(withAdapter.output_ids).toEqual(fromMerged.output_ids);
      expect(withAdapter.output_ids).not.toEqual(base.output_ids); // the adapter matters
      // Merging rounds W + s·BA once in fp32: the log-probs agree to float rounding.
      const a = logprobs(withAdapter);
      const gap = (b: number[]) => Math.max(...b.map((x, i) => Math.abs(x - (a[i] as number))));
      expect(a).toHaveLength(GREEDY.max_new_tokens);
      expect(gap(logprobs(fromMerged))).toBeLessThan(1e-4);
      const [trainer] = await teacherForced(
        MODEL,
        [{ prompt, tokens: withAdapter.output_ids }],
        ADAPTER,
      );
      expect(gap(trainer ?? [])).toBeLessThan(1e-4);
    }
  });

  it("runs base and adapter sequences in one batch, each as it runs alone", async () => {
    const alone = [
      await greedy(served.base, PROMPTS[0] as number[], "a"),
      await greedy(served.base, PROMPTS[1] as number[]),
    ];
    const both = await generateOk<Output[]>(served.base, {
      input_ids: PROMPTS,
      sampling_params: GREEDY,
      return_logprob: true,
      lora_path: ["a", null],
    });
    expect(both.map((o) => o.output_ids)).toEqual(alone.map((o) => o.output_ids));
  });

  it("keeps the prefix cache of the base and of each adapter apart", async () => {
    const prompt = [7, ...(PROMPTS[0] as number[])]; // no other test's prompt starts so
    const base1 = await greedy(served.base, prompt);
    const lora1 = await greedy(served.base, prompt, "a");
    expect(lora1.meta_info.cached_tokens).toBe(0); // the base's blocks are not the adapter's
    const lora2 = await greedy(served.base, prompt, "a");
    expect(lora2.meta_info.cached_tokens).toBe(32);
    expect(lora2.output_ids).toEqual(lora1.output_ids);
    const base2 = await greedy(served.base, prompt);
    expect(base2.meta_info.cached_tokens).toBe(32);
    expect(base2.output_ids).toEqual(base1.output_ids);
  });

  it("loads, lists and unloads adapters as SGLang does; the OpenAI routes take an adapter as the model", async () => {
    const loaded = await post(served.base, "/load_lora_adapter", {
      lora_name: "b",
      lora_path: RSLORA,
    });
    expect(loaded.status).toBe(200);
    expect(loaded.json).toEqual({
      success: true,
      error_message: null,
      loaded_adapters: { a: ADAPTER, b: RSLORA },
    });
    const models = await request(served.base, "GET", "/v1/models");
    expect(
      models.json.data.map((m: { id: string; parent: string | null }) => [m.id, m.parent]),
    ).toEqual([
      [MODEL, null],
      ["a", MODEL],
      ["b", MODEL],
    ]);
    const prompt = PROMPTS[1] as number[];
    const b = await greedy(served.base, prompt, "b");
    const base = await greedy(served.base, prompt);
    expect(b.output_ids).not.toEqual(base.output_ids);
    const completion = await post(served.base, "/v1/completions", {
      model: "b",
      prompt,
      max_tokens: 16,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
    });
    expect(completion.status, completion.text).toBe(200);
    expect(completion.json.model).toBe("b");
    expect(completion.json.choices[0].token_ids).toEqual(b.output_ids);

    const unloaded = await post(served.base, "/unload_lora_adapter", { lora_name: "b" });
    expect(unloaded.json).toEqual({
      success: true,
      error_message: null,
      loaded_adapters: { a: ADAPTER },
    });
    // Gone: named nowhere, refused naming the field; the base answers as before.
    await expectJsonError(
      post(served.base, "/generate", {
        input_ids: prompt,
        sampling_params: GREEDY,
        lora_path: "b",
      }),
      400,
      '"lora_path": no LoRA adapter named "b" is loaded (loaded: a;',
    );
    const missing = await post(served.base, "/v1/completions", {
      model: "b",
      prompt,
      max_tokens: 4,
    });
    expect(missing.status).toBe(404);
    expect(missing.json.error.message).toContain("The model `b` does not exist");
    expect((await greedy(served.base, prompt)).output_ids).toEqual(base.output_ids);
    const again = await post(served.base, "/unload_lora_adapter", { lora_name: "b" });
    expect(again.status).toBe(400);
    expect(again.json).toMatchObject({
      success: false,
      error_message: "no LoRA adapter named 'b' is loaded",
    });
  });

  it("refuses adapters that do not fit, naming the file and field, and keeps serving", async () => {
    const copy = (name: string) => {
      const to = join(dir, name);
      cpSync(ADAPTER, to, { recursive: true });
      return to;
    };
    // An adapter for a wider model: one tensor's shape differs.
    const wide = copy("wide");
    const tensors = await readSafetensors(join(wide, "adapter_model.safetensors"));
    const q = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    await writeSafetensors(
      join(wide, "adapter_model.safetensors"),
      [...tensors].map(([name, t]) =>
        name === q
          ? { name, dtype: "F32" as const, shape: [4, 32], data: new Float32Array(128) }
          : { name, ...t },
      ),
    );
    const refused = await post(served.base, "/load_lora_adapter", {
      lora_name: "w",
      lora_path: wide,
    });
    expect(refused.status).toBe(400);
    expect(refused.json.success).toBe(false);
    expect(refused.json.error_message).toContain(q);
    expect(refused.json.loaded_adapters).toEqual({ a: ADAPTER });
    // A module the engine does not adapt.
    const head = copy("head");
    const config = JSON.parse(readFileSync(join(head, "adapter_config.json"), "utf8"));
    writeFileSync(
      join(head, "adapter_config.json"),
      JSON.stringify({ ...config, target_modules: ["lm_head"] }),
    );
    const r2 = await post(served.base, "/load_lora_adapter", { lora_name: "h", lora_path: head });
    expect(r2.status).toBe(400);
    expect(r2.json.error_message).toMatch(
      /adapter_config\.json: 'target_modules': 'lm_head' is not one of/,
    );
    // No folder; a taken name; an unknown key.
    await expectJsonError(
      post(served.base, "/load_lora_adapter", { lora_name: "x", lora_path: join(dir, "nothing") }),
      400,
      `"lora_path": ${join(dir, "nothing")} is not a folder on the server`,
    );
    const taken = await post(served.base, "/load_lora_adapter", {
      lora_name: "a",
      lora_path: RSLORA,
    });
    expect(taken.json.error_message).toContain("a LoRA adapter named 'a' is already loaded");
    await expectJsonError(
      post(served.base, "/load_lora_adapter", { lora_name: "x", lora_path: RSLORA, scaling: 2 }),
      400,
      '"scaling" is not a known key',
    );
    // Still serving, the adapter as before.
    const prompt = PROMPTS[1] as number[];
    expect((await greedy(served.base, prompt, "a")).meta_info.finish_reason.type).toBe("length");
  });

  it("needs the --api-key on the adapter routes, which read the server's disk", async () => {
    const keyed = await startEngine(["--model", MODEL, "--skip-tokenizer-init", "--api-key", "k"]);
    try {
      const body = JSON.stringify({ lora_name: "b", lora_path: RSLORA });
      for (const path of ["/load_lora_adapter", "/unload_lora_adapter"]) {
        expect((await request(keyed.base, "POST", path, body)).status, path).toBe(401);
      }
      const auth = { headers: { Authorization: "Bearer k" } };
      const ok = await request(keyed.base, "POST", "/load_lora_adapter", body, auth);
      expect(ok.json).toMatchObject({ success: true, loaded_adapters: { b: RSLORA } });
    } finally {
      await keyed.stop();
    }
  });

  it("stops at start when a --lora adapter does not fit, naming it", () => {
    const r = runCli([
      "serve-engine",
      "--port",
      "0",
      "--device",
      "cpu",
      "--threads",
      "1",
      "--model",
      MODEL,
      "--skip-tokenizer-init",
      "--lora",
      `bad=${join(dir, "head")}`,
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `--lora bad=${join(dir, "head")}: ${join(dir, "head")}/adapter_config.json: 'target_modules'`,
    );
  });
});
