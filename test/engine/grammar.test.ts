/**
 * Constrained decoding through the real native engine on the tiny Qwen fixture (random
 * weights: unconstrained, it writes byte soup; constrained, it must write the grammar):
 * - the mask is exact: at each step the tokens the engine lists (top log-probs over the
 *   whole vocabulary) are the tokens whose text keeps the output inside the grammar, found
 *   here from the tokenizer's own decoding, and their log-probs are the unconstrained ones
 *   renormalised over them;
 * - sampled outputs of a JSON Schema parse and match it;
 * - OpenAI's `tool_choice` "required" and named functions, and `response_format`, through the
 *   official `openai` client, and the refusals in OpenAI's error shape;
 * - each token's bytes, read from tokenizer.json, equal the tokenizer's decoding;
 * - the engine's own checks of a grammar.
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { jsonSchemaGrammar } from "../../src/engine/grammar/json-schema.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { tokenBytesHex } from "../../src/text/token-bytes.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { grammarMatches } from "../helpers/grammar-match.js";
import {
  generate,
  generateOk,
  logSumExp,
  modelDir,
  nextTokenLogprobs,
  type Output,
  type RunningEngine,
  request,
  startEngine,
} from "./helpers.js";

const QWEN = modelDir("qwen-bpe");
const VOCAB = 451;
const EOS = [450, 448];
const PROMPT = [17, 42, 99, 7];

let server: RunningEngine;
let client: OpenAI;
let tokenizer: TextTokenizer;
/** Each token id's text as the tokenizer decodes it alone ("" for special tokens). */
let texts: string[];

beforeAll(async () => {
  server = await startEngine(["--model", QWEN]);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "none", maxRetries: 0 });
  tokenizer = TextTokenizer.load(QWEN);
  texts = await Promise.all(Array.from({ length: VOCAB }, (_, id) => tokenizer.decode([id], true)));
}, 60_000);

afterAll(async () => {
  if (server) expect((await server.stop()).code).toBe(0);
});

describe("the mask", () => {
  it("lists exactly the tokens that keep the output inside the grammar, renormalised", async () => {
    const words = ['"alpha"', '"al"', '"beta"'];
    const schema = JSON.stringify({ enum: ["alpha", "al", "beta"] });
    let steps = 0;
    for (const seed of [1, 2, 3]) {
      const out = await generateOk<Output>(server.base, {
        input_ids: PROMPT,
        sampling_params: { temperature: 1, seed, max_new_tokens: 12, json_schema: schema },
        return_logprob: true,
        top_logprobs_num: VOCAB,
      });
      expect(out.meta_info.finish_reason.type).toBe("stop");
      expect(words).toContain(out.text);
      const tops = out.meta_info.output_top_logprobs as [number, number, null][][];
      let sofar = "";
      for (let t = 0; t < out.output_ids.length; t++) {
        const allowed = new Set<number>();
        texts.forEach((text, id) => {
          if (text !== "" && words.some((w) => w.startsWith(sofar + text))) allowed.add(id);
        });
        if (words.includes(sofar)) for (const id of EOS) allowed.add(id);
        const listed = tops[t] as [number, number, null][];
        expect(new Set(listed.map(([, id]) => id))).toEqual(allowed);
        // The unconstrained log-probs at the same place, from a one-token run.
        const rawOf = await nextTokenLogprobs(
          server.base,
          [...PROMPT, ...out.output_ids.slice(0, t)],
          VOCAB,
        );
        const norm = logSumExp([...allowed].map((id) => rawOf.get(id) as number));
        for (const [lp, id] of listed) expect(lp).toBeCloseTo((rawOf.get(id) as number) - norm, 4);
        sofar += texts[out.output_ids[t] as number];
        steps++;
      }
    }
    expect(steps).toBeGreaterThan(6);
  });
});

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 6 },
    age: { type: "integer" },
    tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 2 },
    ok: { type: "boolean" },
  },
  required: ["name", "age"],
};

function expectPerson(text: string): void {
  expect(grammarMatches(jsonSchemaGrammar(PERSON, "schema"), text), text).toBe(true);
  const v = JSON.parse(text);
  expect(typeof v.name).toBe("string");
  expect(Number.isInteger(v.age)).toBe(true);
  expect(Object.keys(v).every((k) => k in PERSON.properties)).toBe(true);
}

describe("/generate's json_schema (SGLang's sampling key)", () => {
  it("sampled outputs that end are documents the schema accepts", async () => {
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        seed: 11,
        n: 12,
        max_new_tokens: 400,
        json_schema: JSON.stringify(PERSON),
      },
    });
    const ended = outs.filter((o) => o.meta_info.finish_reason.type === "stop");
    expect(ended.length).toBeGreaterThanOrEqual(6);
    for (const o of ended) expectPerson(o.text);
    // Unconstrained, the same model writes no JSON at all.
    const free = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: { temperature: 1, seed: 11, max_new_tokens: 40 },
    });
    expect(() => JSON.parse(free.text)).toThrow();
  });

  it("regex and ebnf (SGLang's keys): sampled outputs that end match the whole expression", async () => {
    for (const pattern of [
      "\\d{3}-\\d{4}",
      "(yes|no|maybe)( please)?",
      "[a-z]{2,6}@[a-z]{2,4}\\.(com|org)",
    ]) {
      const outs = await generateOk<Output[]>(server.base, {
        input_ids: PROMPT,
        sampling_params: { temperature: 1, seed: 3, n: 8, max_new_tokens: 40, regex: pattern },
      });
      const ended = outs.filter((o) => o.meta_info.finish_reason.type === "stop");
      expect(ended.length, pattern).toBeGreaterThanOrEqual(6);
      for (const o of ended) expect(o.text, pattern).toMatch(new RegExp(`^(?:${pattern})$`));
    }
    // The same language as an EBNF grammar (SGLang's ebnf key).
    const ebnf = 'root ::= answer ("," answer){0,2}\nanswer ::= "yes" | "no" | [0-9]{1,3}';
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: PROMPT,
      sampling_params: { temperature: 1, seed: 5, n: 8, max_new_tokens: 40, ebnf },
    });
    const ended = outs.filter((o) => o.meta_info.finish_reason.type === "stop");
    expect(ended.length).toBeGreaterThanOrEqual(6);
    for (const o of ended)
      expect(o.text).toMatch(/^(yes|no|[0-9]{1,3})(,(yes|no|[0-9]{1,3})){0,2}$/);
    const both = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: { regex: "a", json_schema: "{}" },
    });
    expect(both.status).toBe(400);
    expect((both.json as { error: string }).error).toMatch(
      /"sampling_params\.json_schema" and "sampling_params\.regex" both constrain the output: give one/,
    );
  });

  it("a KV cache too small for the load (sequences wait and are preempted): the same outputs", async () => {
    const body = {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        seed: 21,
        n: 12,
        max_new_tokens: 150,
        json_schema: JSON.stringify(PERSON),
      },
    };
    const roomy = await generateOk<Output[]>(server.base, body);
    const tight = await startEngine(["--model", QWEN, "--kv-cache-mb", "0.1"]);
    try {
      const outs = await generateOk<Output[]>(tight.base, body);
      expect(outs.map((o) => o.output_ids)).toEqual(roomy.map((o) => o.output_ids));
      const info = (await request(tight.base, "GET", "/get_server_info")).json as Record<
        string,
        number
      >;
      expect(info.kv_full_steps).toBeGreaterThan(0);
    } finally {
      await tight.stop();
    }
    for (const o of roomy.filter((x) => x.meta_info.finish_reason.type === "stop"))
      expectPerson(o.text);
  });

  it("a schema too ambiguous to follow ends its request with a 400; the server keeps serving", async () => {
    // anyOf of two equal array schemas, recursing: each "[" doubles the ways to parse.
    const nest = { type: "array", items: { $ref: "#/$defs/n" } };
    const schema = { $defs: { n: { anyOf: [nest, nest] } }, $ref: "#/$defs/n" };
    const [open] = await tokenizer.encode("[", { addSpecialTokens: false });
    const r = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        max_new_tokens: 40,
        json_schema: JSON.stringify(schema),
        logit_bias: { [String(open)]: 100 },
      },
    });
    expect(r.status).toBe(400);
    expect((r.json as { error: string }).error).toMatch(
      /more than 256 ways to parse the output so far \(the grammar is too ambiguous\)/,
    );
    const ok = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: { max_new_tokens: 10, json_schema: '{"enum": ["yes", "no"]}' },
    });
    expect(['"yes"', '"no"']).toContain(ok.text);
  });

  it("bad schemas are a 400 naming the field; the server keeps serving", async () => {
    const r = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: { json_schema: '{"type": "string", "pattern": "a+"}' },
    });
    expect(r.status).toBe(400);
    const error = (reply: { json: unknown }) => (reply.json as { error: string }).error;
    expect(error(r)).toMatch(
      /^"sampling_params\.json_schema\.pattern": the JSON Schema keyword "pattern" is not supported/,
    );
    const notJson = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: { json_schema: "{" },
    });
    expect(notJson.status).toBe(400);
    expect(error(notJson)).toMatch(/^"sampling_params\.json_schema" is not JSON/);
    const regex = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: { regex: "(a)\\1" },
    });
    expect(regex.status).toBe(400);
    expect(error(regex)).toMatch(/^"sampling_params\.regex": the escape \\1 is not supported/);
    const ebnf = await generate(server.base, {
      input_ids: PROMPT,
      sampling_params: { ebnf: 'root ::= root "a" | "a"' },
    });
    expect(ebnf.status).toBe(400);
    expect(error(ebnf)).toMatch(/the rule "root" is left-recursive/);
    const ok = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: { max_new_tokens: 2 },
    });
    expect(ok.output_ids).toHaveLength(2);
  });
});

const TOOLS = [
  {
    type: "function" as const,
    function: {
      name: "search",
      description: "Searches the web",
      parameters: {
        type: "object",
        properties: {
          query_list: {
            type: "array",
            items: { type: "string", maxLength: 8 },
            minItems: 1,
            maxItems: 2,
          },
        },
        required: ["query_list"],
      },
    },
  },
  {
    type: "function" as const,
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
];
const MESSAGES = [{ role: "user" as const, content: "Where is the Eiffel tower?" }];

function expectCallOf(call: { function: { name: string; arguments: string } }, names: string[]) {
  expect(names).toContain(call.function.name);
  const tool = TOOLS.find((t) => t.function.name === call.function.name) as (typeof TOOLS)[number];
  const grammar = jsonSchemaGrammar(tool.function.parameters, "parameters");
  expect(grammarMatches(grammar, call.function.arguments), call.function.arguments).toBe(true);
}

describe("OpenAI's forced tool calls and response formats, with the openai client", () => {
  it('tool_choice "required": every choice that ends is tool calls of the tools', async () => {
    const chat = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      tools: TOOLS,
      tool_choice: "required",
      temperature: 1,
      seed: 5,
      n: 6,
      max_tokens: 300,
    });
    const ended = chat.choices.filter((c) => c.finish_reason !== "length");
    expect(ended.length).toBeGreaterThanOrEqual(3);
    for (const c of ended) {
      expect(c.finish_reason).toBe("tool_calls");
      expect(c.message.tool_calls?.length).toBeGreaterThanOrEqual(1);
      for (const call of c.message.tool_calls ?? []) {
        expectCallOf(call as { function: { name: string; arguments: string } }, [
          "search",
          "get_weather",
        ]);
      }
    }
  });

  it("a named function: one call of it; streamed, the same call", async () => {
    const ask = {
      model: QWEN,
      messages: MESSAGES,
      tools: TOOLS,
      tool_choice: { type: "function" as const, function: { name: "get_weather" } },
      temperature: 1,
      seed: 8,
      max_tokens: 300,
    };
    const chat = await client.chat.completions.create(ask);
    const choice = chat.choices[0];
    expect(choice?.finish_reason).not.toBe("length");
    expect(choice?.message.tool_calls).toHaveLength(1);
    const call = choice?.message.tool_calls?.[0] as {
      function: { name: string; arguments: string };
    };
    expectCallOf(call, ["get_weather"]);

    const stream = await client.chat.completions.create({ ...ask, stream: true });
    let args = "";
    let name = "";
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        for (const t of c.delta.tool_calls ?? []) {
          name += t.function?.name ?? "";
          args += t.function?.arguments ?? "";
        }
      }
    }
    expect({ name, args }).toEqual({ name: call.function.name, args: call.function.arguments });
  });

  it("response_format json_schema and json_object", async () => {
    const chat = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      response_format: {
        type: "json_schema",
        json_schema: { name: "person", schema: PERSON, strict: true },
      },
      temperature: 1,
      seed: 3,
      n: 4,
      max_tokens: 400,
    });
    const ended = chat.choices.filter((c) => c.finish_reason === "stop");
    expect(ended.length).toBeGreaterThanOrEqual(2);
    for (const c of ended) expectPerson(c.message.content as string);

    const obj = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      response_format: { type: "json_object" },
      temperature: 0,
      max_tokens: 400,
    });
    const text = obj.choices[0]?.message.content as string;
    expect(obj.choices[0]?.finish_reason).toBe("stop");
    expect(JSON.parse(text)).toBeTypeOf("object");
    expect(text.trimStart().startsWith("{")).toBe(true);
  });

  it("vLLM's structured outputs on both routes: structured_outputs and the guided_* keys", async () => {
    // biome-ignore lint/suspicious/noExplicitAny: vLLM's extensions of the request
    const extra = (x: Record<string, unknown>) => x as any;
    const choice = await client.completions.create({
      model: QWEN,
      prompt: PROMPT,
      temperature: 1,
      seed: 2,
      n: 4,
      max_tokens: 10,
      ...extra({ structured_outputs: { choice: ["alpha", "beta", "gamma ray"] } }),
    });
    for (const c of choice.choices) expect(["alpha", "beta", "gamma ray"]).toContain(c.text);
    const regex = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      temperature: 1,
      seed: 3,
      n: 3,
      max_tokens: 20,
      ...extra({ guided_regex: "[A-Z][a-z]{1,5} (Paris|Rome)" }),
    });
    for (const c of regex.choices)
      expect(c.message.content).toMatch(/^[A-Z][a-z]{1,5} (Paris|Rome)$/);
    const json = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      temperature: 1,
      seed: 4,
      max_tokens: 400,
      ...extra({ structured_outputs: { json: JSON.stringify(PERSON) } }),
    });
    expect(json.choices[0]?.finish_reason).toBe("stop");
    expectPerson(json.choices[0]?.message.content as string);
    const grammar = await client.completions.create({
      model: QWEN,
      prompt: PROMPT,
      temperature: 1,
      seed: 5,
      max_tokens: 20,
      ...extra({ guided_grammar: 'root ::= "x" [0-9]{2} ("!" | "?")' }),
    });
    expect(grammar.choices[0]?.text).toMatch(/^x[0-9]{2}[!?]$/);
    // whitespace_pattern: compact JSON.
    const compact = await client.completions.create({
      model: QWEN,
      prompt: PROMPT,
      temperature: 1,
      seed: 6,
      n: 3,
      max_tokens: 60,
      ...extra({
        structured_outputs: {
          json: {
            type: "object",
            properties: { a: { type: "integer" }, b: { type: "boolean" } },
            required: ["a", "b"],
          },
          whitespace_pattern: "",
        },
      }),
    });
    for (const c of compact.choices) {
      if (c.finish_reason === "stop")
        expect(c.text).toMatch(/^\{"a":(0|-?[1-9][0-9]*),"b":(true|false)\}$/);
    }
    expect(compact.choices.some((c) => c.finish_reason === "stop")).toBe(true);
  });

  it("what cannot be forced is the client's BadRequestError naming it; the server keeps serving", async () => {
    const refused = async (extra: Record<string, unknown>, message: RegExp) => {
      const err = await client.chat.completions
        // biome-ignore lint/suspicious/noExplicitAny: requests the client's types would not allow
        .create({ model: QWEN, messages: MESSAGES, max_tokens: 4, ...(extra as any) })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as Error).message).toMatch(message);
    };
    await refused(
      { tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } },
      /"tool_choice.function.name" = "nope" is not among "tools" \("search", "get_weather"\)/,
    );
    await refused(
      {
        tools: [
          {
            type: "function",
            function: { name: "f", parameters: { type: "string", format: "date" } },
          },
        ],
        tool_choice: "required",
      },
      /"tools\[0\]\.function\.parameters\.format"/,
    );
    await refused(
      { tools: TOOLS, tool_choice: "required", response_format: { type: "json_object" } },
      /both constrain the output: give one/,
    );
    await refused(
      { response_format: { type: "yaml" } },
      /"response_format.type" must be "text", "json_object" or "json_schema"/,
    );
    await refused({ tool_choice: "required" }, /needs "tools"/);
    await refused(
      { response_format: { type: "json_object" }, guided_regex: "a" },
      /"response_format" and "guided_regex" both constrain the output: give one/,
    );
    await refused(
      { structured_outputs: { lark: "x" } },
      /"structured_outputs\.lark" is not supported/,
    );
    await refused({ guided_choice: [] }, /"guided_choice" must be a non-empty list of strings/);
    await refused(
      { guided_regex: "a", guided_whitespace_pattern: "" },
      /"guided_whitespace_pattern" is the whitespace of a JSON constraint/,
    );
    const ok = await client.chat.completions.create({
      model: QWEN,
      messages: MESSAGES,
      max_tokens: 2,
    });
    expect(ok.choices[0]?.finish_reason).toBe("length");
  });
});

describe("token bytes from tokenizer.json", () => {
  it("byte-level BPE: each token's bytes decode as the tokenizer decodes it; special tokens have none", () => {
    const hex = tokenBytesHex(`${QWEN}/tokenizer.json`);
    expect(hex).toHaveLength(VOCAB);
    let checked = 0;
    hex.forEach((h, id) => {
      const text = Buffer.from(h, "hex").toString("utf8");
      if (!text.includes("\uFFFD") && (texts[id] as string) !== "") {
        expect(text).toBe(texts[id]);
        checked++;
      }
    });
    expect(checked).toBeGreaterThan(250);
    for (const id of EOS) expect(hex[id]).toBe("");
  });

  it("SentencePiece byte fallback: <0xNN> is that byte, ▁ a space", async () => {
    const dir = modelDir("llama-sp");
    const hex = tokenBytesHex(`${dir}/tokenizer.json`);
    const sp = TextTokenizer.load(dir);
    const bytesOf = async (text: string) => {
      const ids = await sp.encode(text, { addSpecialTokens: false });
      const bytes = Buffer.concat(ids.map((id) => Buffer.from(hex[id] as string, "hex")));
      return { bytes: bytes.toString(), decoded: await sp.decode(ids, true) };
    };
    expect(await bytesOf(" the cat")).toEqual({ bytes: " the cat", decoded: "the cat" });
    // é and ☃ are byte tokens (3 of them for ☃); the decoder strips the prepended space.
    expect(await bytesOf("héllo ☃")).toEqual({ bytes: " héllo ☃", decoded: "héllo ☃" });
    expect(hex.slice(0, 3)).toEqual(["", "", ""]); // <unk>, <s>, </s>
    expect(hex[3 + 0x41]).toBe("41"); // <0x41>
  });

  it("a vocabulary without bytes (WordLevel) is refused naming the file; over HTTP, a 400", async () => {
    const dir = modelDir("tiny-vocab");
    expect(() => tokenBytesHex(`${dir}/tokenizer.json`)).toThrow(
      /tiny-vocab\/tokenizer\.json: constrained decoding needs each token's bytes.*decoder is null/,
    );
    const tiny = await startEngine(["--model", dir]);
    try {
      const r = await generate(tiny.base, {
        input_ids: [1, 2],
        sampling_params: { json_schema: "{}" },
      });
      expect(r.status).toBe(400);
      expect(r.text).toMatch(
        /needs constrained decoding, which this server cannot do: .*tokenizer\.json/,
      );
    } finally {
      await tiny.stop();
    }
  });
});

describe("the engine's checks of a grammar (stdio protocol)", () => {
  it("refuses bad grammars naming the node, and grammars before token bytes or with ignore_eos", async () => {
    const child = spawn(
      nativeExecutable("searchr1-engine"),
      ["--model", QWEN, "--device", "cpu", "--threads", "1"],
      {
        stdio: ["pipe", "pipe", "ignore"],
      },
    );
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    const next = async () => JSON.parse((await lines.next()).value as string);
    const send = (cmd: object) => child.stdin.write(`${JSON.stringify(cmd)}\n`);
    expect((await next()).ev).toBe("ready");
    const ask = (rid: string, grammar: unknown, extra = {}) =>
      send({
        op: "generate",
        rid,
        input_ids: PROMPT,
        max_new_tokens: 4,
        temperature: 0,
        top_p: 1,
        top_k: -1,
        min_p: 0,
        seed: 0,
        stop_token_ids: [],
        ignore_eos: false,
        grammar,
        ...extra,
      });
    const lit = { start: 0, nodes: [{ lit: "a" }] };
    ask("r0", lit);
    expect(await next()).toMatchObject({
      ev: "error",
      rid: "r0",
      message: expect.stringMatching(/send token_bytes first/),
    });
    send({ op: "token_bytes", id: 1, tokens: tokenBytesHex(`${QWEN}/tokenizer.json`) });
    expect(await next()).toMatchObject({ ev: "reply", id: 1, ok: true });
    const bad: [unknown, RegExp][] = [
      [{ start: 0, nodes: [{ seq: [1, 0] }, { lit: "" }] }, /node 0 is left-recursive/],
      [
        { start: 0, nodes: [{ rep: 1 }, { class: [[97, 98]], min: 0, max: 3 }] },
        /node 0 repeats a node that can match no bytes/,
      ],
      [{ start: 0, nodes: [{ alt: [5] }] }, /node 0: a node index must be an integer in \[0, 1\)/],
      [{ start: 0, nodes: [{ class: [[98, 97]] }] }, /'class' ranges must be \[lo, hi\]/],
      [{ start: 2, nodes: [{ lit: "x" }] }, /'start' must be a node index/],
      [
        { start: 0, nodes: [{ regex: "x" }] },
        /must have one of 'lit', 'class', 'seq', 'alt', 'rep'/,
      ],
    ];
    for (const [i, [grammar, message]] of bad.entries()) {
      ask(`b${i}`, grammar);
      expect(await next()).toMatchObject({
        ev: "error",
        rid: `b${i}`,
        message: expect.stringMatching(message),
      });
    }
    ask("e", lit, { ignore_eos: true });
    expect(await next()).toMatchObject({
      ev: "error",
      rid: "e",
      message: expect.stringMatching(/ignore_eos/),
    });
    // A good one runs: "a", then only the end tokens are left.
    ask("ok", lit);
    const tokens: number[] = [];
    for (;;) {
      const ev = await next();
      if (ev.ev === "tokens") tokens.push(...ev.out.map((o: [string, number]) => o[1]));
      if (ev.ev === "done") {
        expect(ev).toMatchObject({ rid: "ok", reason: "stop" });
        break;
      }
    }
    expect(tokens).toHaveLength(2);
    expect(texts[tokens[0] as number]).toBe("a");
    expect(EOS).toContain(tokens[1]);
    send({ op: "shutdown" });
    await new Promise((resolve) => child.on("close", resolve));
  });
});
