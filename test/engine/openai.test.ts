import { spawnSync } from "node:child_process";
import { chmodSync, cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI, { AuthenticationError, BadRequestError, NotFoundError } from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VllmClient } from "../../src/engine/client/vllm.js";
import { jsonSchemaGrammar } from "../../src/engine/grammar/json-schema.js";
import type { ChatMessage } from "../../src/text/chat-template.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import { grammarMatches } from "../helpers/grammar-match.js";
import {
  type GreedyCase,
  greedy,
  modelDir,
  type Output,
  type Reply,
  type RunningEngine,
  request,
  sleep,
  startEngine,
} from "./helpers.js";

/**
 * serve-engine's OpenAI API driven by the official `openai` client (the npm package) against
 * a real serve-engine on the loopback: the tiny Qwen fixture on the real native engine, and
 * a scripted engine (same stdio protocol) where the model must write a tool call. What
 * /v1/... answers is checked against /generate on the same tokens, the chat prompts against
 * the chat template's rendering (and, with the scripted engine, against the texts Python's
 * Jinja2 renders as transformers' apply_chat_template does:
 * test/text/fixtures/hermes/reference.json).
 */

/**
 * The official `openai` Python package, where this machine has one (PyPI is not needed: any
 * folder on SEARCHR1_OPENAI_PYTHONPATH where `import openai` works; docs/development.md).
 * Without it that test is skipped, and says so.
 */
const PYTHON = process.env.PYTHON ?? "python3";
const PYTHON_CLIENT = fileURLToPath(new URL("./openai_python_client.py", import.meta.url));
const PYTHON_ENV = {
  ...process.env,
  PYTHONPATH: [process.env.SEARCHR1_OPENAI_PYTHONPATH, process.env.PYTHONPATH]
    .filter(Boolean)
    .join(":"),
};
const PYTHON_OPENAI = (() => {
  const r = spawnSync(PYTHON, ["-c", "import openai"], { env: PYTHON_ENV, encoding: "utf8" });
  const ok = r.status === 0;
  if (!ok) {
    process.stderr.write(
      "engine/openai.test.ts: the openai Python package test is SKIPPED: `import openai` failed (set SEARCHR1_OPENAI_PYTHONPATH)\n",
    );
  }
  return { ok };
})();

const QWEN = modelDir("qwen-bpe");
/** A schema whose documents are bounded (so greedy decoding of a random model ends). */
const FORCED = {
  type: "object",
  properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] } },
  required: ["city", "unit"],
};
const KEY = "sk-test-5f1c2a9d";
const NAME = "tiny-qwen";
const cases = greedy().cases.filter((c) => c.model === "qwen-bpe");
const byName = (name: string) => cases.find((c) => c.name === name) as GreedyCase;
const AUTH = { Authorization: `Bearer ${KEY}` };

let server: RunningEngine;
let client: OpenAI;
let tokenizer: ModelTokenizer;

beforeAll(async () => {
  // The key comes from the environment, as a deployment would give it.
  server = await startEngine(["--model", QWEN, "--served-model-name", NAME], {
    env: { SEARCHR1_API_KEY: KEY },
  });
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: KEY, maxRetries: 0 });
  tokenizer = ModelTokenizer.load(QWEN);
}, 60_000);

afterAll(async () => {
  if (server) {
    const r = await server.stop();
    expect(r.code).toBe(0);
    // The key is never written to the log.
    expect(r.stderr).not.toContain(KEY);
  }
});

async function generate(body: unknown): Promise<Output> {
  const r = await request(server.base, "POST", "/generate", JSON.stringify(body), {
    headers: AUTH,
  });
  if (r.status !== 200) throw new Error(`/generate answered ${r.status}: ${r.text}`);
  return r.json as Output;
}

// biome-ignore lint/suspicious/noExplicitAny: server info JSON
async function serverInfo(): Promise<any> {
  const r = await request(server.base, "GET", "/get_server_info", undefined, { headers: AUTH });
  expect(r.status).toBe(200);
  return r.json;
}

/** vLLM's extensions of the request (top_k, ignore_eos, return_token_ids, ...). */
// biome-ignore lint/suspicious/noExplicitAny: the client's types know only OpenAI's keys
type Extra = any;

const MESSAGES = [
  { role: "system" as const, content: "You answer briefly." },
  { role: "user" as const, content: "Who wrote the novel 1984?" },
];

describe("OpenAI API with the openai client", () => {
  it("GET /v1/models lists the served model with its context length", async () => {
    const list = await client.models.list();
    expect(list.data).toHaveLength(1);
    expect(list.data[0]).toMatchObject({
      id: NAME,
      object: "model",
      owned_by: "searchr1",
      root: QWEN,
      max_model_len: 512,
    });
  });

  it("a greedy completion of token ids equals /generate on them (text, tokens, usage)", async () => {
    const c = byName("len5");
    const r = await client.completions.create({
      model: NAME,
      prompt: c.prompt_ids,
      max_tokens: 24,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
    } as Extra);
    expect(r.object).toBe("text_completion");
    expect(r.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(r.model).toBe(NAME);
    const choice = r.choices[0] as Extra;
    expect(choice.token_ids).toEqual(c.output_ids);
    expect(choice.text).toBe(c.text);
    expect(choice.finish_reason).toBe("length");
    expect(r.usage).toMatchObject({
      prompt_tokens: c.prompt_ids.length,
      completion_tokens: 24,
      total_tokens: c.prompt_ids.length + 24,
    });
  });

  it("a text prompt is tokenized as the model's tokenizer does; a batch of prompts × n", async () => {
    const prompts = ["The capital of France is", "Orwell wrote"];
    const ids = await Promise.all(
      prompts.map((p) => tokenizer.encode(p, { addSpecialTokens: true })),
    );
    const r = await client.completions.create({
      model: NAME,
      prompt: prompts,
      n: 2,
      seed: 40,
      max_tokens: 12,
      return_token_ids: true,
    } as Extra);
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(r.usage?.prompt_tokens).toBe((ids[0] as number[]).length + (ids[1] as number[]).length);
    let completion = 0;
    for (let p = 0; p < 2; p++) {
      for (let s = 0; s < 2; s++) {
        // Sample s of a prompt is /generate's with seed + s.
        const ref = await generate({
          input_ids: ids[p],
          sampling_params: { max_new_tokens: 12, seed: 40 + s },
        });
        const choice = r.choices[p * 2 + s] as Extra;
        expect(choice.token_ids).toEqual(ref.output_ids);
        expect(choice.text).toBe(ref.text);
        completion += ref.output_ids.length;
      }
    }
    expect(r.usage?.completion_tokens).toBe(completion);
  });

  it("a greedy chat completion equals /generate on the chat template's tokens", async () => {
    const prompt = await tokenizer.encodeChat(MESSAGES, { addGenerationPrompt: true });
    const ref = await generate({
      input_ids: prompt,
      sampling_params: { temperature: 0, max_new_tokens: 40 },
      return_logprob: true,
    });
    const r = await client.chat.completions.create({
      model: NAME,
      messages: MESSAGES,
      temperature: 0,
      max_completion_tokens: 40,
      logprobs: true,
      return_token_ids: true,
    } as Extra);
    expect(r.object).toBe("chat.completion");
    expect(r.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    const choice = r.choices[0] as Extra;
    expect(choice.message.role).toBe("assistant");
    expect(choice.message.content).toBe(ref.text);
    expect(choice.token_ids).toEqual(ref.output_ids);
    expect(choice.finish_reason).toBe(ref.meta_info.finish_reason.type);
    // usage counts tokens: the rendered prompt's, and the sampled ones.
    expect(r.usage?.prompt_tokens).toBe(prompt.length);
    expect(r.usage?.completion_tokens).toBe(ref.output_ids.length);
    expect(r.usage?.total_tokens).toBe(prompt.length + ref.output_ids.length);
    // One log-prob per sampled token, the engine's, with its token's text and bytes.
    const content = choice.logprobs.content as {
      token: string;
      logprob: number;
      bytes: number[];
      top_logprobs: unknown[];
    }[];
    expect(content).toHaveLength(ref.output_ids.length);
    for (let i = 0; i < content.length; i++) {
      const entry = content[i] as (typeof content)[number];
      const id = ref.output_ids[i] as number;
      expect(entry.token).toBe(await tokenizer.decode([id], false));
      expect(entry.bytes).toEqual([...Buffer.from(entry.token, "utf8")]);
      expect(entry.logprob).toBeCloseTo(ref.meta_info.output_token_logprobs?.[i]?.[0] as number, 4);
      expect(entry.top_logprobs).toEqual([]);
    }
  });

  it("a streamed chat sends the same text as the answer, then the usage and [DONE]", async () => {
    const body = { model: NAME, messages: MESSAGES, temperature: 0, max_tokens: 40 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({
      ...body,
      stream: true,
      stream_options: { include_usage: true },
      logprobs: true,
    });
    let text = "";
    let roles = 0;
    let finish: string | null = null;
    let logprobs = 0;
    let usage: OpenAI.CompletionUsage | null | undefined = null;
    const ids = new Set<string>();
    for await (const chunk of stream) {
      ids.add(chunk.id);
      expect(chunk.object).toBe("chat.completion.chunk");
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) roles++;
        text += c.delta.content ?? "";
        logprobs += c.logprobs?.content?.length ?? 0;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    expect(ids.size).toBe(1);
    expect(roles).toBe(1);
    expect(text).toBe(whole.choices[0]?.message.content);
    expect(finish).toBe(whole.choices[0]?.finish_reason);
    expect(usage?.prompt_tokens).toBe(whole.usage?.prompt_tokens);
    expect(usage?.completion_tokens).toBe(whole.usage?.completion_tokens);
    expect(logprobs).toBe(whole.usage?.completion_tokens);
  });

  it("the raw stream is server-sent events ending with data: [DONE]", async () => {
    const r = await request(
      server.base,
      "POST",
      "/v1/completions",
      JSON.stringify({ prompt: [5, 6, 7], max_tokens: 6, temperature: 0, stream: true }),
      { headers: AUTH },
    );
    expect(r.status).toBe(200);
    expect(r.headers["content-type"]).toBe("text/event-stream; charset=utf-8");
    const events = r.text.split("\n\n").filter((e) => e !== "");
    for (const e of events) expect(e).toMatch(/^data: /);
    expect(events[events.length - 1]).toBe("data: [DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
    expect(chunks.every((c) => c.object === "text_completion")).toBe(true);
    const last = chunks[chunks.length - 1];
    expect(last.choices[0].finish_reason).toBe("length");
    const ref = await generate({
      input_ids: [5, 6, 7],
      sampling_params: { temperature: 0, max_new_tokens: 6 },
    });
    expect(chunks.map((c) => c.choices[0].text).join("")).toBe(ref.text);
  });

  it("n > 1 with a seed: sample i is /generate's with seed + i, and the same seed repeats", async () => {
    const body = { model: NAME, messages: MESSAGES, n: 3, seed: 11, max_tokens: 16 };
    const prompt = await tokenizer.encodeChat(MESSAGES, { addGenerationPrompt: true });
    const a = await client.chat.completions.create(body);
    const b = await client.chat.completions.create(body);
    expect(a.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(b.choices.map((c) => c.message.content)).toEqual(
      a.choices.map((c) => c.message.content),
    );
    for (let s = 0; s < 3; s++) {
      const ref = await generate({
        input_ids: prompt,
        sampling_params: { max_new_tokens: 16, seed: 11 + s },
      });
      expect(a.choices[s]?.message.content).toBe(ref.text);
    }
    const other = await client.chat.completions.create({ ...body, seed: 12 });
    // seed 12's first sample is seed 11's second.
    expect(other.choices[0]?.message.content).toBe(a.choices[1]?.message.content);
    expect(new Set(a.choices.map((c) => c.message.content)).size).toBeGreaterThan(1);
  });

  it("stop strings end the text before them (stop_reason names them), streamed alike", async () => {
    const c = byName("len5");
    const stop = c.text.slice(6, 9);
    const cut = c.text.indexOf(stop);
    expect(cut).toBeGreaterThan(0);
    const body = {
      model: NAME,
      prompt: c.prompt_ids,
      max_tokens: 24,
      temperature: 0,
      stop: [stop],
    };
    const r = await client.completions.create(body);
    const choice = r.choices[0] as Extra;
    expect(choice.text).toBe(c.text.slice(0, cut));
    expect(choice.finish_reason).toBe("stop");
    expect(choice.stop_reason).toBe(stop);
    let streamed = "";
    for await (const chunk of await client.completions.create({ ...body, stream: true })) {
      streamed += chunk.choices[0]?.text ?? "";
    }
    expect(streamed).toBe(choice.text);
  });

  it("completions' logprobs 0: the sampled tokens, their log-probs and offsets", async () => {
    const c = byName("len5");
    const r = await client.completions.create({
      model: NAME,
      prompt: c.prompt_ids,
      max_tokens: 24,
      temperature: 0,
      ignore_eos: true,
      logprobs: 0,
    } as Extra);
    const lp = r.choices[0]?.logprobs as Extra;
    expect(lp.token_logprobs).toHaveLength(24);
    for (let i = 0; i < 24; i++) {
      expect(lp.token_logprobs[i]).toBeCloseTo(c.logprobs[i] as number, 4);
      expect(lp.tokens[i]).toBe(await tokenizer.decode([c.output_ids[i] as number], false));
      expect(lp.top_logprobs[i]).toEqual({ [lp.tokens[i]]: lp.token_logprobs[i] });
    }
    expect(lp.text_offset[0]).toBe(0);
    expect(lp.text_offset[1]).toBe(lp.tokens[0].length);
  });

  it("chat's top_logprobs: the most likely tokens, the greedy one first; streamed alike", async () => {
    const body = {
      model: NAME,
      messages: MESSAGES,
      temperature: 0,
      max_tokens: 24,
      logprobs: true,
      top_logprobs: 5,
    };
    const r = await client.chat.completions.create(body);
    const content = r.choices[0]?.logprobs?.content ?? [];
    expect(content).toHaveLength(r.usage?.completion_tokens as number);
    for (const entry of content) {
      const top = entry.top_logprobs;
      expect(top).toHaveLength(5);
      // Greedy: the sampled token is the most likely, with the same log-prob.
      expect(top[0]?.token).toBe(entry.token);
      expect(top[0]?.logprob).toBeCloseTo(entry.logprob, 6);
      for (let k = 0; k < top.length; k++) {
        const t = top[k] as (typeof top)[number];
        expect(t.logprob).toBeLessThanOrEqual(0);
        if (k > 0) expect(t.logprob).toBeLessThanOrEqual((top[k - 1] as typeof t).logprob);
        expect(t.bytes).toEqual([...Buffer.from(t.token, "utf8")]);
      }
      // The probabilities of distinct tokens sum to at most 1.
      expect(top.reduce((sum, t) => sum + Math.exp(t.logprob), 0)).toBeLessThanOrEqual(1 + 1e-6);
    }
    const streamed: typeof content = [];
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
      streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    }
    expect(streamed).toEqual(content);
  });

  it("completions' logprobs N: the sampled token and the N most likely, as /generate ranks them", async () => {
    const c = byName("len5");
    const body = {
      model: NAME,
      prompt: c.prompt_ids,
      max_tokens: 24,
      temperature: 0.8,
      seed: 11,
      ignore_eos: true,
      logprobs: 3,
      return_token_ids: true,
    } as Extra;
    const r = await client.completions.create(body);
    const ref = await generate({
      input_ids: c.prompt_ids,
      sampling_params: { max_new_tokens: 24, temperature: 0.8, seed: 11, ignore_eos: true },
      return_logprob: true,
      top_logprobs_num: 3,
    });
    const choice = r.choices[0] as Extra;
    expect(choice.token_ids).toEqual(ref.output_ids);
    const lp = choice.logprobs;
    const tops = ref.meta_info.output_top_logprobs ?? [];
    expect(tops).toHaveLength(24);
    for (let i = 0; i < 24; i++) {
      const dict = lp.top_logprobs[i] as Record<string, number>;
      // The sampled token first, then the 3 most likely (4 entries when it is not among them).
      const want: Record<string, number> = { [lp.tokens[i]]: lp.token_logprobs[i] };
      for (const [logprob, id] of tops[i] ?? []) {
        const text = await tokenizer.decode([id], false);
        if (!(text in want)) want[text] = logprob;
      }
      expect(Object.keys(dict)).toEqual(Object.keys(want));
      for (const [text, logprob] of Object.entries(want)) {
        expect(dict[text]).toBeCloseTo(logprob, 6);
      }
      expect(Object.keys(dict).length).toBeGreaterThanOrEqual(3);
      expect(Object.keys(dict).length).toBeLessThanOrEqual(4);
    }
    let streamed = 0;
    for await (const chunk of await client.completions.create({ ...body, stream: true })) {
      const part = chunk.choices[0]?.logprobs as Extra;
      for (const dict of part?.top_logprobs ?? []) {
        expect(dict).toEqual(lp.top_logprobs[streamed]);
        streamed++;
      }
    }
    expect(streamed).toBe(24);
  });

  it("bad requests are answered in OpenAI's error shape, and the server keeps serving", async () => {
    const refused = async (body: Extra, param: string | null, route = "chat") => {
      const call =
        route === "chat"
          ? client.chat.completions.create({ model: NAME, messages: MESSAGES, ...body })
          : client.completions.create({ model: NAME, prompt: "x", ...body });
      const err = await call.then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(BadRequestError);
      const e = err as InstanceType<typeof BadRequestError>;
      expect(e.status).toBe(400);
      expect(e.type).toBe("invalid_request_error");
      expect(e.param).toBe(param);
      return e;
    };
    await refused({ temperature: -1 }, "temperature");
    await refused({ top_p: 0 }, "top_p");
    await refused({ messages: [] }, "messages");
    await refused(
      { messages: [{ role: "user", content: [{ type: "image_url" }] }] },
      "messages[0].content[0]",
    );
    await refused({ top_logprobs: 21, logprobs: true }, "top_logprobs");
    const alone = await refused({ top_logprobs: 2 }, "top_logprobs");
    expect(alone.message).toContain('needs "logprobs": true');
    await refused({ logprobs: 21 }, "logprobs", "completions");
    await refused({ stream_options: { include_usage: true } }, "stream_options", "completions");
    await refused({ prompt: [1, 2, 451] }, "prompt[2]", "completions");
    const e = await refused({ echo: true }, "echo", "completions");
    expect(e.message).toContain("not supported");
    const misspelt = await refused({ max_tokenz: 3 }, "max_tokenz", "completions");
    expect(misspelt.message).toContain('did you mean "max_tokens"');
    const tool = await refused(
      {
        tool_choice: { type: "function", function: { name: "g" } },
        tools: [{ type: "function", function: { name: "f" } }],
      },
      "tool_choice.function.name",
    );
    expect(tool.message).toContain('is not among "tools"');
    const format = await refused(
      {
        response_format: {
          type: "json_schema",
          json_schema: { name: "x", schema: { pattern: "a" } },
        },
      },
      "response_format.json_schema.schema.pattern",
    );
    expect(format.message).toContain('"pattern" is not supported');

    const missing = await client.chat.completions
      .create({ model: "gpt-4o", messages: MESSAGES })
      .catch((err: unknown) => err);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect((missing as InstanceType<typeof NotFoundError>).code).toBe("model_not_found");

    const raw = await request(server.base, "POST", "/v1/chat/completions", "{not json", {
      headers: AUTH,
    });
    expect(raw.status).toBe(400);
    expect(raw.json.error).toMatchObject({
      type: "invalid_request_error",
      param: null,
      code: null,
    });
    expect(raw.json.error.message).toContain("not valid JSON");
    const route = await request(server.base, "GET", "/v1/embeddings", undefined, { headers: AUTH });
    expect(route.status).toBe(404);
    expect(typeof route.json.error.message).toBe("string");

    // Still serving, and still right.
    const c = byName("len5");
    const r = await client.completions.create({
      model: NAME,
      prompt: c.prompt_ids,
      max_tokens: 24,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
    } as Extra);
    expect((r.choices[0] as Extra).token_ids).toEqual(c.output_ids);
  });

  it("a prompt too long for the context is a 400 naming it", async () => {
    const long = Array.from({ length: 600 }, (_, i) => 5 + (i % 100));
    const err = await client.completions
      .create({ model: NAME, prompt: long })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as Extra).param).toBe("prompt");
    expect((err as Extra).message).toContain("600 tokens");
  });

  it("a stream the client stops reading frees its sequences in the engine", async () => {
    const before = await serverInfo();
    const stream = await client.chat.completions.create({
      model: NAME,
      messages: MESSAGES,
      max_tokens: 400,
      n: 4,
      ignore_eos: true,
      stream: true,
    } as Extra);
    let chunks = 0;
    for await (const _ of stream as AsyncIterable<unknown>) {
      if (++chunks >= 6) break;
    }
    (stream as Extra).controller.abort();
    const end = Date.now() + 20_000;
    let info = await serverInfo();
    while (info.running_requests + info.queued_requests > 0 || info.kv_blocks_used > 0) {
      if (Date.now() > end) throw new Error(`sequences still live: ${JSON.stringify(info)}`);
      await sleep(20);
      info = await serverInfo();
    }
    // Far fewer than the 4 × 400 tokens asked for were generated.
    expect(info.generated_tokens - before.generated_tokens).toBeLessThan(4 * 400);
    expect(info.http_requests_in_flight).toBe(1);
  });

  it("a connection that never sent a request does not hold up SIGTERM", async () => {
    // undici (fetch, the openai client) opens one after a request it aborted; Node's
    // closeIdleConnections leaves such connections open.
    const other = await startEngine(["--model", QWEN]);
    const url = new URL(other.base);
    const socket = connect(Number(url.port), url.hostname);
    await new Promise((resolve) => socket.once("connect", resolve));
    const started = Date.now();
    const r = await other.stop();
    expect(r.code).toBe(0);
    expect(Date.now() - started).toBeLessThan(10_000);
    socket.destroy();
  });

  it("the same prefix cache as /generate: a repeated prompt is served from it", async () => {
    const messages = [
      {
        role: "user" as const,
        content: "A prompt long enough to fill a block or two of the cache.",
      },
    ];
    await client.chat.completions.create({ model: NAME, messages, max_tokens: 2 });
    const again = await client.chat.completions.create({ model: NAME, messages, max_tokens: 2 });
    expect((again.usage as Extra).prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(16);
  });
});

describe("--api-key", () => {
  it("a wrong key raises the client's AuthenticationError; none is a 401 in OpenAI's shape", async () => {
    const wrong = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
    const err = await wrong.models.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AuthenticationError);
    expect((err as Extra).status).toBe(401);
    expect((err as Extra).code).toBe("invalid_api_key");

    for (const [method, path] of [
      ["GET", "/v1/models"],
      ["POST", "/generate"],
      ["GET", "/get_server_info"],
      ["POST", "/update_weights_from_disk"],
    ] as const) {
      const r: Reply = await request(
        server.base,
        method,
        path,
        method === "POST" ? "{}" : undefined,
      );
      expect(r.status, path).toBe(401);
      expect(r.headers["www-authenticate"]).toBe("Bearer");
      expect(r.json.error).toMatchObject({
        type: "invalid_request_error",
        code: "invalid_api_key",
      });
      expect(r.json.error.message).toContain("Authorization: Bearer");
    }
    const prefix = await request(server.base, "GET", "/v1/models", undefined, {
      headers: { Authorization: `Bearer ${KEY}x` },
    });
    expect(prefix.status).toBe(401);
  });

  it("/health needs no key; the right key opens every route; the key is not shown", async () => {
    expect((await request(server.base, "GET", "/health")).status).toBe(200);
    const info = await request(server.base, "GET", "/get_server_info", undefined, {
      headers: { Authorization: `bearer ${KEY}` },
    });
    expect(info.status).toBe(200);
    expect(info.json.api_key_required).toBe(true);
    expect(info.text).not.toContain(KEY);
  });

  it("a server bound beyond the loopback without a key warns at start; with one it does not", async () => {
    const open = await startEngine(["--model", QWEN, "--host", "0.0.0.0"]);
    const openRun = await open.stop();
    expect(openRun.stderr).toContain("warning: listening on 0.0.0.0 without --api-key");
    expect(openRun.stderr).toContain(
      "/update_weights_from_disk reads files from this machine's disk",
    );
    const keyed = await startEngine(["--model", QWEN, "--host", "0.0.0.0", "--api-key", KEY]);
    const keyedRun = await keyed.stop();
    expect(keyedRun.stderr).not.toContain("warning: listening");
    expect(keyedRun.stderr).not.toContain(KEY);
  });
});

describe("this project's vLLM client against /v1/completions", () => {
  let open: RunningEngine;
  beforeAll(async () => {
    open = await startEngine(["--model", QWEN]);
  }, 60_000);
  afterAll(async () => {
    if (open) expect((await open.stop()).code).toBe(0);
  });

  it("gives the tokens, log-probs and stop /generate gives", async () => {
    const vllm = new VllmClient(open.base);
    const c = byName("len5");
    const turn = {
      inputIds: c.prompt_ids,
      maxNewTokens: 24,
      sampling: { temperature: 0, topP: 1, topK: -1 },
      stop: [] as string[],
      seed: null,
    };
    const ask = (body: unknown) =>
      request(open.base, "POST", "/generate", JSON.stringify(body)).then((r) => r.json as Output);
    const ref = await ask({
      input_ids: c.prompt_ids,
      sampling_params: { temperature: 0, max_new_tokens: 24 },
      return_logprob: true,
    });
    const out = await vllm.generate(turn);
    expect(out.outputIds).toEqual(ref.output_ids);
    expect(out.finish).toBe(ref.meta_info.finish_reason.type);
    const refLogprobs = (ref.meta_info.output_token_logprobs ?? []).map(([lp]) => lp);
    expect(out.logprobs).toHaveLength(refLogprobs.length);
    for (const [i, lp] of (out.logprobs ?? []).entries()) {
      expect(lp).toBeCloseTo(refLogprobs[i] as number, 4);
    }

    // A stop string: the token that completes it is kept, and it is named.
    const stop = c.text.slice(6, 9);
    const stopped = await vllm.generate({ ...turn, stop: [stop] });
    const refStop = await ask({
      input_ids: c.prompt_ids,
      sampling_params: { temperature: 0, max_new_tokens: 24, stop: [stop] },
    });
    expect(stopped.outputIds).toEqual(refStop.output_ids);
    expect(stopped).toMatchObject({ finish: "stop", matched: stop });
  });
});

/**
 * Tool calls need a model that writes one: the scripted engine answers every prompt with a
 * Hermes call, on the tiny Qwen folder given Qwen2.5-Instruct's chat template.
 */
describe("tools, through a scripted engine", () => {
  const TEMPLATE = fileURLToPath(
    new URL("../text/fixtures/templates/qwen2.5-instruct.jinja", import.meta.url),
  );
  const REFERENCE = fileURLToPath(
    new URL("../text/fixtures/hermes/reference.json", import.meta.url),
  );
  const SCRIPT = fileURLToPath(new URL("./scripted-native-engine.mjs", import.meta.url));
  const REPLY =
    'I need to search.\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["capital of France"]}}\n</tool_call>';
  let dir: string;
  let model: string;
  let log: string;
  let scripted: RunningEngine;
  let tools: OpenAI;
  let qwen: ModelTokenizer;
  const reference = JSON.parse(readFileSync(REFERENCE, "utf8")) as {
    tool_schema: OpenAI.ChatCompletionTool;
    chat: {
      name: string;
      messages: ChatMessage[];
      tools: OpenAI.ChatCompletionTool[] | null;
      add_generation_prompt: boolean;
      text: string;
    }[];
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "sr1-openai-tools-"));
    model = join(dir, "model");
    cpSync(QWEN, model, { recursive: true });
    cpSync(TEMPLATE, join(model, "chat_template.jinja"));
    qwen = ModelTokenizer.load(model);
    const reply = [...(await qwen.encode(REPLY, { addSpecialTokens: false })), 450];
    const bin = join(dir, "bin");
    cpSync(SCRIPT, join(bin, "engine.mjs"));
    writeFileSync(
      join(bin, "searchr1-engine"),
      `#!/bin/sh\nexec "${process.execPath}" "${join(bin, "engine.mjs")}" "$@"\n`,
    );
    chmodSync(join(bin, "searchr1-engine"), 0o755);
    log = join(dir, "generate.jsonl");
    scripted = await startEngine(["--model", model], {
      env: {
        SEARCHR1_NATIVE_DIR: bin,
        SCRIPTED_REPLY: JSON.stringify(reply),
        SCRIPTED_LOG: log,
      },
    });
    tools = new OpenAI({ baseURL: `${scripted.base}/v1`, apiKey: "unused", maxRetries: 0 });
  }, 60_000);

  afterAll(async () => {
    if (scripted) expect((await scripted.stop()).code).toBe(0);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** The prompt of the last generate command the engine got, decoded. */
  async function lastPrompt(): Promise<{ ids: number[]; text: string }> {
    const lines = readFileSync(log, "utf8").trim().split("\n");
    const ids = JSON.parse(lines[lines.length - 1] as string).input_ids as number[];
    return { ids, text: await qwen.decode(ids, false) };
  }

  const ask = [{ role: "user" as const, content: "What is the capital of France?" }];

  it("a Hermes call comes back as tool_calls, finish_reason tool_calls", async () => {
    const r = await tools.chat.completions.create({
      model,
      messages: ask,
      tools: [reference.tool_schema],
    });
    const choice = r.choices[0] as OpenAI.ChatCompletion.Choice;
    expect(choice.finish_reason).toBe("tool_calls");
    expect(choice.message.content).toBe("I need to search.\n");
    const calls = choice.message.tool_calls ?? [];
    expect(calls).toHaveLength(1);
    const call = calls[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.type).toBe("function");
    expect(call.id).toMatch(/^call_[0-9a-f]{32}$/);
    expect(call.function.name).toBe("search");
    expect(JSON.parse(call.function.arguments)).toEqual({ query_list: ["capital of France"] });
    // The tools were rendered into the prompt as the template writes them.
    const prompt = await lastPrompt();
    expect(prompt.text).toBe(
      qwen.applyChatTemplate(ask, { addGenerationPrompt: true, tools: [reference.tool_schema] }),
    );
    expect(r.usage?.prompt_tokens).toBe(prompt.ids.length);
  });

  it("streamed: the text before the call, then the call in the last chunk", async () => {
    const stream = await tools.chat.completions.create({
      model,
      messages: ask,
      tools: [reference.tool_schema],
      stream: true,
    });
    let text = "";
    const calls: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.delta.content ?? "";
      calls.push(...(c.delta.tool_calls ?? []));
      if (c.finish_reason) finish = c.finish_reason;
    }
    expect(text).toBe("I need to search.\n");
    expect(finish).toBe("tool_calls");
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "search" } });
    expect(JSON.parse(calls[0]?.function?.arguments ?? "")).toEqual({
      query_list: ["capital of France"],
    });
  });

  it('tool_choice "none" reads no calls: the text comes back as written', async () => {
    const r = await tools.chat.completions.create({
      model,
      messages: ask,
      tools: [reference.tool_schema],
      tool_choice: "none",
    });
    expect(r.choices[0]?.message.content).toBe(REPLY);
    expect(r.choices[0]?.message.tool_calls).toBeUndefined();
    expect(r.choices[0]?.finish_reason).toBe("stop");
  });

  it("prompts are the texts transformers renders (Jinja2), OpenAI's tool_calls messages included", async () => {
    for (const c of reference.chat) {
      // OpenAI's wire form: a call's arguments are JSON text (the server decodes them, as
      // vLLM does, for templates that write `arguments | tojson`).
      const messages = c.messages.map((m) =>
        Array.isArray(m.tool_calls)
          ? {
              ...m,
              tool_calls: (m.tool_calls as Extra[]).map((call, i) => ({
                id: `call_${i}`,
                ...call,
                function: { ...call.function, arguments: JSON.stringify(call.function.arguments) },
              })),
            }
          : m,
      );
      const r = await tools.chat.completions.create({
        model,
        messages,
        ...(c.tools ? { tools: c.tools } : {}),
        add_generation_prompt: c.add_generation_prompt,
        max_tokens: 1,
      } as Extra);
      const prompt = await lastPrompt();
      expect(prompt.text, c.name).toBe(c.text);
      expect(r.usage?.prompt_tokens, c.name).toBe(
        (await qwen.encode(c.text, { addSpecialTokens: false })).length,
      );
    }
  });

  it.skipIf(!PYTHON_OPENAI.ok)(
    "the official openai Python package: chat, stream, completion, errors and tool calls",
    async () => {
      const run = spawnSync(PYTHON, [PYTHON_CLIENT], {
        input: JSON.stringify({
          base: server.base,
          key: KEY,
          model: NAME,
          messages: MESSAGES,
          tools_base: scripted.base,
          tools_model: model,
          tools: [reference.tool_schema],
          ask,
          forced_tools: [{ type: "function", function: { name: "weather", parameters: FORCED } }],
          schema: FORCED,
          choices: ["red", "green", "blue sky"],
        }),
        env: PYTHON_ENV,
        encoding: "utf8",
        timeout: 60_000,
      });
      expect(run.status, run.stderr).toBe(0);
      const out = JSON.parse(run.stdout) as Extra;
      expect(out.models.map((m: Extra) => m.id)).toEqual([NAME]);

      // Greedy chat: /generate's text on the chat template's tokens, and their count.
      const prompt = await tokenizer.encodeChat(MESSAGES, { addGenerationPrompt: true });
      const ref = await generate({
        input_ids: prompt,
        sampling_params: { temperature: 0, max_new_tokens: 40 },
      });
      expect(out.chat.choices[0].message.content).toBe(ref.text);
      expect(out.chat.choices[0].finish_reason).toBe(ref.meta_info.finish_reason.type);
      expect(out.chat.usage).toMatchObject({
        prompt_tokens: prompt.length,
        completion_tokens: ref.output_ids.length,
        total_tokens: prompt.length + ref.output_ids.length,
      });
      // Streamed: the same text, then the usage chunk (stream_options.include_usage).
      // (The repeated prompt is now served from the prefix cache: cached_tokens differ.)
      expect(out.stream).toMatchObject({
        text: ref.text,
        finish_reason: out.chat.choices[0].finish_reason,
        usage: { prompt_tokens: prompt.length, completion_tokens: ref.output_ids.length },
      });
      // A text completion: /generate on the tokenizer's ids of the prompt.
      const ids = await tokenizer.encode("The capital of France is", { addSpecialTokens: false });
      const textRef = await generate({
        input_ids: ids,
        sampling_params: { temperature: 0, max_new_tokens: 8 },
      });
      expect(out.completion.choices[0].text).toBe(textRef.text);
      expect(out.completion.usage.prompt_tokens).toBe(ids.length);
      // The client's exception classes, from the status codes and error bodies.
      expect(out.wrong_key).toEqual({
        class: "AuthenticationError",
        status: 401,
        code: "invalid_api_key",
      });
      expect(out.bad_request).toEqual({ class: "BadRequestError", status: 400 });
      // The scripted model's Hermes call, parsed by the client into tool_calls.
      const message = out.tool_call.choices[0].message;
      expect(out.tool_call.choices[0].finish_reason).toBe("tool_calls");
      expect(message.content).toBe("I need to search.\n");
      expect(message.tool_calls).toHaveLength(1);
      expect(message.tool_calls[0].function.name).toBe("search");
      expect(JSON.parse(message.tool_calls[0].function.arguments)).toEqual({
        query_list: ["capital of France"],
      });
      expect(out.tool_call_stream.finish_reason).toBe("tool_calls");
      expect(out.tool_call_stream.tool_calls).toHaveLength(1);
      expect(out.tool_call_stream.tool_calls[0].function.name).toBe("search");
      // Constrained decoding (greedy, on the tiny model): a call of the named function whose
      // arguments follow its schema, and a reply that is a document of the schema.
      const grammar = jsonSchemaGrammar(FORCED, "schema");
      const forced = out.forced.choices[0];
      expect(forced.finish_reason).toBe("tool_calls");
      expect(forced.message.tool_calls).toHaveLength(1);
      expect(forced.message.tool_calls[0].function.name).toBe("weather");
      expect(grammarMatches(grammar, forced.message.tool_calls[0].function.arguments)).toBe(true);
      const formatted = out.formatted.choices[0];
      expect(formatted.finish_reason).toBe("stop");
      expect(grammarMatches(grammar, formatted.message.content)).toBe(true);
      expect(Object.keys(JSON.parse(formatted.message.content))).toEqual(["city", "unit"]);
      expect(out.chosen.choices).toHaveLength(3);
      for (const c of out.chosen.choices) expect(["red", "green", "blue sky"]).toContain(c.text);
    },
    90_000,
  );
});
