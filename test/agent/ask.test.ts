import { afterAll, beforeAll, expect, it } from "vitest";
import { formatTurn } from "../../src/agent/ask.js";
import { startCli } from "../helpers/cli.js";
import { type ServedIndex, serveTestIndex } from "../retrieval/helpers.js";
import { EOS, AGENT_MODEL as MODEL, agentTokenizer as tokenizer } from "./helpers.js";
import { type ScriptedEngine, startScriptedEngine } from "./scripted-engine.js";

let served: ServedIndex;
let engine: ScriptedEngine;

beforeAll(async () => {
  served = await serveTestIndex();
  engine = await startScriptedEngine(tokenizer, EOS, (context) =>
    context.includes("Doc 1(Title:")
      ? { text: "<think> it says actor </think>\n<answer> an actor </answer>" }
      : { text: "<think> I should look him up. </think>\n<search> Paul Walker </search>" },
  );
}, 60_000);

afterAll(async () => {
  await engine?.close();
  await served?.close();
});

const ask = (extra: string[]) =>
  startCli([
    "ask",
    "who played Brian",
    "--model",
    MODEL,
    "--engine-url",
    engine.url,
    "--retriever-url",
    served.server.url,
    "data.max_obs_length=200",
    ...extra,
  ]).result;

it("shows each turn: reasoning, query, document titles, then the answer (plain when piped)", async () => {
  const r = await ask([]);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout).toBe(
    [
      "turn 1",
      "  <think> I should look him up. </think>",
      "  search: Paul Walker",
      '    1. "Paul Walker" [0]',
      "turn 2",
      "  <think> it says actor </think>",
      "  answer: an actor",
      "",
    ].join("\n"),
  );
  // The question was normalised and put in the Search-R1 prompt, rendered with the chat template.
  expect(engine.requests.at(-2)?.context).toContain(
    "Question: who played Brian?\n<|im_end|>\n<|im_start|>assistant\n",
  );
});

it("--json prints one object for scripts", async () => {
  const r = await ask(["--json"]);
  expect(r.code, r.stderr).toBe(0);
  const out = JSON.parse(r.stdout);
  expect(out.answer).toBe("an actor");
  expect(out.question).toBe("who played Brian?");
  expect(out.prompt).toMatch(
    /^<\|im_start\|>system\n.*Question: who played Brian\?\n<\|im_end\|>\n<\|im_start\|>assistant\n$/s,
  );
  expect(out.searches).toBe(1);
  expect(out.finish_reason).toBe("answer");
  expect(out.turns.map((t: { action: string }) => t.action)).toEqual(["search", "answer"]);
  expect(out.response).toContain('<information>Doc 1(Title: "Paul Walker")');
});

it("colours a turn for a terminal", () => {
  const text = formatTurn(
    {
      action: "answer",
      query: "x",
      text: "<answer> x </answer>",
      tokens: 3,
      finish: "stop",
      documents: [],
      observation: "",
      observationTruncated: false,
    },
    0,
    true,
  );
  expect(text).toBe("\x1b[1mturn 1\x1b[22m\n  \x1b[32manswer:\x1b[39m x");
});
