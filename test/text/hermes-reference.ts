/**
 * The reference results of test/text/make_hermes_fixtures.py: verl's Hermes tool-call
 * parsing and Qwen2.5's chat template rendered with `tools=` as transformers renders it.
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { ChatMessage, ToolSchema } from "../../src/text/chat-template.js";

export const HERMES_FIXTURES = fileURLToPath(new URL("./fixtures/hermes/", import.meta.url));

export interface HermesReference {
  versions: Record<string, string>;
  /** verl's HermesToolParser: content and calls (arguments as json.dumps wrote them). */
  parse: {
    name: string;
    text: string;
    content: string;
    calls: { name: string; arguments: string }[];
  }[];
  /** search_tool_config.yaml's schema as verl hands it to apply_chat_template. */
  tool_schema: ToolSchema;
  chat: {
    name: string;
    template: string;
    messages: ChatMessage[];
    tools: ToolSchema[] | null;
    add_generation_prompt: boolean;
    text: string;
  }[];
}

export const hermesReference = JSON.parse(
  readFileSync(`${HERMES_FIXTURES}reference.json`, "utf8"),
) as HermesReference;
