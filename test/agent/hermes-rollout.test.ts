import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { HermesFormat } from "../../src/agent/hermes-step.js";
import { promptIds } from "../../src/agent/prompt.js";
import { RetrieverClient } from "../../src/agent/retriever-client.js";
import { type AgentSettings, rollout } from "../../src/agent/rollout.js";
import { passagesToText } from "../../src/agent/search-tool.js";
import { SEARCH_TOOL } from "../../src/agent/tool-config.js";
import { SglangClient } from "../../src/engine/client/sglang.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import { type ServedIndex, serveTestIndex } from "../retrieval/helpers.js";
import { hermesReference } from "../text/hermes-reference.js";
import { templateFile } from "../text/reference.js";
import { AGENT_MODEL, EOS } from "./helpers.js";
import { type ScriptedEngine, startScriptedEngine } from "./scripted-engine.js";

/**
 * The Hermes format end to end against a scripted SGLang-protocol engine and a real
 * retriever: the tiny Qwen-style tokenizer with Qwen2.5-Instruct's real chat template
 * (chat_template.jinja wins over the folder's ChatML one), verl's tool-agent semantics.
 */

const HERMES: HermesFormat = {
  kind: "hermes",
  tools: [SEARCH_TOOL],
  maxAssistantTurns: null,
  maxParallelCalls: 1,
  maxToolResponseLength: 100_000,
  truncateSide: "middle",
};
const settings = (format: Partial<HermesFormat> = {}, extra: Partial<AgentSettings> = {}) =>
  ({
    maxTurns: 4,
    maxStartLength: 4096,
    maxPromptLength: 8192,
    maxResponseLength: 2000,
    maxObsLength: 500,
    sampling: { temperature: 0, topP: 1, topK: -1 },
    compat: "none",
    format: { ...HERMES, ...format },
    ...extra,
  }) satisfies AgentSettings;

let dir: string;
let model: ModelTokenizer;
let served: ServedIndex;
const engines: ScriptedEngine[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "hermes-rollout-"));
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
    copyFileSync(join(AGENT_MODEL, f), join(dir, f));
  }
  copyFileSync(templateFile("qwen2.5-instruct"), join(dir, "chat_template.jinja"));
  model = ModelTokenizer.load(dir);
  served = await serveTestIndex();
}, 60_000);

afterAll(async () => {
  await Promise.all(engines.map((e) => e.close()));
  await served?.close();
  rmSync(dir, { recursive: true, force: true });
});

const common = () => served.ix.vocabulary[0] as string;
const call = (queries: unknown, name = "search") =>
  `<tool_call>\n${JSON.stringify({ name, arguments: { query_list: queries } })}\n</tool_call>`;
const QUESTION = [{ role: "user", content: hermesReference.chat[0]?.messages[0]?.content ?? "" }];

async function run(
  replies: string[],
  s: AgentSettings,
  retrieverUrl = served.server.url,
): Promise<{
  engine: ScriptedEngine;
  retriever: RetrieverClient;
  prompt: number[];
  t: Awaited<ReturnType<typeof rollout>>;
}> {
  let n = 0;
  const engine = await startScriptedEngine(model.tokenizer, EOS, () => ({
    text: replies[Math.min(n++, replies.length - 1)] as string,
    eos: true,
  }));
  engines.push(engine);
  const retriever = new RetrieverClient({
    url: retrieverUrl,
    topk: 3,
    timeoutMs: 10_000,
    maxRetries: 0,
  });
  const prompt = await promptIds(model, QUESTION, s.format);
  const t = await rollout({ promptIds: prompt, seed: null }, s, {
    engine: new SglangClient(engine.url),
    retriever,
    tokenizer: model.tokenizer,
    chat: model,
  });
  return { engine, retriever, prompt, t };
}

describe("Hermes format: verl's tool agent loop", () => {
  it("renders the tools into the prompt exactly as transformers does", async () => {
    const prompt = await promptIds(model, QUESTION, settings().format);
    expect(await model.decode(prompt, false)).toBe(hermesReference.chat[0]?.text);
  });

  it("a search call: one retriever batch, a <tool_response> turn masked out, tokens as generated", async () => {
    const q = [common(), "zzz unknown words"];
    const { engine, retriever, prompt, t } = await run(
      [call(q), "<answer>Paris</answer>"],
      settings(),
    );
    expect(engine.requests).toHaveLength(2);
    const [first, second] = engine.requests;
    // Hermes turns stop at EOS only, with the whole remaining budget.
    expect(first?.body.sampling_params).toMatchObject({ max_new_tokens: 2000 });
    expect((first?.body.sampling_params as { stop?: unknown } | undefined)?.stop ?? []).toEqual([]);
    expect(first?.inputIds).toEqual(prompt);

    // Both queries in one request to the retriever.
    expect(retriever.stats.requests).toBe(1);
    expect(retriever.stats.queries).toBe(2);
    expect(t.searches).toBe(2);

    // The tool turn: verl's text, rendered by the template, system prompt removed.
    const docs = await Promise.all(
      q.map((query) =>
        new RetrieverClient({
          url: served.server.url,
          topk: 3,
          timeoutMs: 10_000,
          maxRetries: 0,
        }).search(query),
      ),
    );
    const result = `{"result": ${JSON.stringify(docs.map(passagesToText).join("\n---\n"))}}`;
    const toolTurn = `<|im_start|>user\n<tool_response>\n${result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`;
    expect(t.turns[0]?.observation).toBe(toolTurn);

    // Token in, token out: the second request is the first context + the engine's ids + the
    // tool turn's ids; the trajectory holds exactly that, masked 1 / 0.
    const gen1 = t.responseIds.slice(0, t.turns[0]?.tokens);
    expect(gen1.at(-1)).toBe(EOS);
    const toolIds = t.responseIds.slice(
      gen1.length,
      t.responseIds.length - (t.turns[1]?.tokens ?? 0),
    );
    expect(await model.decode(toolIds, false)).toBe(toolTurn);
    expect(second?.inputIds).toEqual([...prompt, ...gen1, ...toolIds]);
    expect(t.lossMask).toEqual([
      ...gen1.map(() => 1),
      ...toolIds.map(() => 0),
      ...Array(t.turns[1]?.tokens).fill(1),
    ]);
    expect(
      t.logprobs.slice(gen1.length, gen1.length + toolIds.length).every((l) => l === null),
    ).toBe(true);
    expect(t.finishReason).toBe("answer");
    expect(t.turns.map((turn) => turn.action)).toEqual(["search", "answer"]);
    expect(t.turns[0]?.query).toBe(JSON.stringify(q));
  });

  it("a call's query_list reaches the retriever server as one request (as verl's tool posts it)", async () => {
    // A loopback proxy in front of the real BM25 server records the requests it forwards.
    const bodies: { queries: string[] }[] = [];
    const proxy = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      bodies.push(JSON.parse(body.toString("utf8")));
      const answer = await fetch(served.server.url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      });
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(Buffer.from(await answer.arrayBuffer()));
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    try {
      const { port } = proxy.address() as AddressInfo;
      const q = [common(), "zzz unknown words", served.ix.vocabulary[1] as string];
      const { t } = await run(
        [call(q), "<answer>x</answer>"],
        settings(),
        `http://127.0.0.1:${port}/retrieve`,
      );
      expect(bodies).toEqual([{ queries: q, topk: 3, return_scores: true }]);
      expect(t.searches).toBe(3);
    } finally {
      await new Promise((resolve) => proxy.close(resolve));
    }
  });

  it("max_parallel_calls runs the first calls only; an unknown tool gets verl's error text", async () => {
    const two = `${call(["a"], "lookup")}\n${call([common()])}`;
    const one = await run([two, "<answer>x</answer>"], settings({ maxParallelCalls: 1 }));
    expect(one.t.turns[0]?.observation).toBe(
      "<|im_start|>user\n<tool_response>\nError when executing tool: 'lookup'\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    );
    expect(one.retriever.stats.requests).toBe(0);
    const both = await run([two, "<answer>x</answer>"], settings({ maxParallelCalls: 2 }));
    expect(both.t.turns[0]?.observation.split("<tool_response>")).toHaveLength(3);
    expect(both.t.searches).toBe(1);
  });

  it("max_tool_response_length cuts the response's middle as verl does", async () => {
    const { t } = await run(
      [call([common()]), "<answer>x</answer>"],
      settings({ maxToolResponseLength: 20 }),
    );
    // The whole JSON text is cut: its first 10 and last 10 characters around the marker.
    expect(t.turns[0]?.observation).toMatch(
      /^<\|im_start\|>user\n<tool_response>\n\{"result":\.\.\.\(truncated\)\.\.\.[^\n]{8}"\}\n<\/tool_response><\|im_end\|>\n/,
    );
    expect(t.turns[0]?.observationTruncated).toBe(true);
  });

  it("ends after max_assistant_turns, without running the call", async () => {
    const { t, retriever, engine } = await run(
      [call([common()])],
      settings({ maxAssistantTurns: 1 }),
    );
    expect(engine.requests).toHaveLength(1);
    expect(retriever.stats.requests).toBe(0);
    expect(t.lossMask.every((m) => m === 1)).toBe(true);
    expect(t.finishReason).toBe("max_turns");
  });

  it("a turn without a decodable call ends the trajectory (no_answer)", async () => {
    const { t, engine } = await run(["<tool_call>{not json}</tool_call>"], settings());
    expect(engine.requests).toHaveLength(1);
    expect(t.finishReason).toBe("no_answer");
    expect(t.invalidActions).toBe(1);
  });

  it("the response budget spans turns: a tool turn that would reach it ends the trajectory", async () => {
    const generated =
      (await model.encode(call([common()]), { addSpecialTokens: false })).length + 1;
    const budget = generated + 10; // room for the call, not for its tool turn
    const { t, engine } = await run(
      [call([common()]), "<answer>x</answer>"],
      settings({}, { maxResponseLength: budget }),
    );
    expect(engine.requests).toHaveLength(1);
    expect(t.turns[0]?.finish).toBe("stop");
    expect(t.responseIds.length).toBe(generated);
    expect(t.lossMask.every((m) => m === 1)).toBe(true);
    expect(t.finishReason).toBe("max_turns");
  });
});
