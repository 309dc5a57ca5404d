import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ChatTemplate } from "../../src/text/chat-template.js";
import { parseHermesToolCalls } from "../../src/text/hermes-tool-calls.js";
import { hermesReference } from "./hermes-reference.js";
import { templateFile } from "./reference.js";

/**
 * Hermes tool calls as verl's HermesToolParser extracts them
 * (verl/experimental/agent_loop/tool_parser.py): the expected values are what Python's
 * `regex` and `json.loads` give on the same texts (test/text/make_hermes_fixtures.py).
 */
describe("parseHermesToolCalls against verl's parser (Python reference)", () => {
  it("the reference covers kept, dropped and mixed calls", () => {
    expect(hermesReference.parse.length).toBeGreaterThanOrEqual(15);
    expect(hermesReference.parse.some((c) => c.calls.length >= 2)).toBe(true);
    expect(
      hermesReference.parse.some((c) => c.calls.length === 0 && c.text.includes("<tool_call>")),
    ).toBe(true);
  });

  it.each(hermesReference.parse.map((c) => [c.name, c] as const))("%s", (_, c) => {
    const got = parseHermesToolCalls(c.text);
    expect(got.content).toBe(c.content);
    expect(got.calls.map((call) => call.name)).toEqual(c.calls.map((call) => call.name));
    // verl hands the arguments on as json.dumps(arguments, ensure_ascii=False); the values
    // compare equal once decoded.
    expect(got.calls.map((call) => call.arguments)).toEqual(
      c.calls.map((call) => JSON.parse(call.arguments)),
    );
  });
});

describe("parseHermesToolCalls", () => {
  const two =
    'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["a"]}}\n</tool_call>\n' +
    '<tool_call>\n{"name": "search", "arguments": {"query_list": ["b", "c"]}}\n</tool_call><|im_end|>';

  it("keeps the first maxCalls calls, as verl slices with max_parallel_calls", () => {
    expect(parseHermesToolCalls(two, 1).calls).toEqual([
      { name: "search", arguments: { query_list: ["a"] } },
    ]);
    expect(parseHermesToolCalls(two, 2).calls).toHaveLength(2);
    expect(parseHermesToolCalls(two, 0).calls).toEqual([]);
    // content still loses every block, as verl's parser removes them before the slice
    expect(parseHermesToolCalls(two, 1).content).toBe("Let me look.\n\n<|im_end|>");
  });

  it("drops calls before counting: an undecodable first call leaves room for the next", () => {
    const text = `<tool_call>{"name": "search", "arguments": }</tool_call>${two}`;
    expect(parseHermesToolCalls(text, 1).calls).toEqual([
      { name: "search", arguments: { query_list: ["a"] } },
    ]);
  });

  it("refuses a negative maxCalls", () => {
    expect(() => parseHermesToolCalls(two, -1)).toThrow(/maxCalls/);
  });
});

/**
 * Qwen2.5-Instruct's real template with `tools=`, against Jinja2 in transformers' chat
 * environment (make_hermes_fixtures.py): the tools in the system prompt, tool turns, and
 * assistant tool_calls.
 */
describe("chat template with tools: identical text to apply_chat_template", () => {
  it("the reference covers tools, no tools, an empty list and tool turns", () => {
    expect(hermesReference.chat.length).toBeGreaterThanOrEqual(8);
    expect(hermesReference.chat.some((c) => c.tools?.length === 0)).toBe(true);
    expect(hermesReference.chat.some((c) => c.text.includes("<tool_response>"))).toBe(true);
    expect(hermesReference.chat.some((c) => c.text.includes("<tools>"))).toBe(true);
  });

  it.each(hermesReference.chat.map((c) => [c.name, c] as const))("%s", (_, c) => {
    const file = templateFile(c.template);
    const template = new ChatTemplate(readFileSync(file, "utf8"), file);
    const text = template.render(c.messages, {
      addGenerationPrompt: c.add_generation_prompt,
      ...(c.tools ? { tools: c.tools } : {}),
    });
    expect(text).toBe(c.text);
  });
});
