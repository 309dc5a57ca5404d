/**
 * What follows a model turn in the Hermes format, as verl's ToolAgentLoop does it (verl
 * verl/experimental/agent_loop/tool_agent_loop.py, `_handle_generating_state` and
 * `_handle_processing_tools_state`; agent_loop.py `apply_chat_template` with
 * remove_system_prompt):
 * 1. the trajectory ends when the response has used its budget, or after
 *    `maxAssistantTurns` model turns;
 * 2. the turn's text (decoded with its special tokens) is parsed for `<tool_call>`s; none
 *    ends the trajectory; the first `maxParallelCalls` are run together, each answered by
 *    one `tool` message (search-tool.ts: a call's query_list goes to the retriever as one
 *    batch, the documents rendered as verl's search tool renders them, the text cut to
 *    `maxToolResponseLength` characters);
 * 3. the tool messages are rendered by the chat template alone with an assistant turn
 *    opened (`<|im_start|>user\n<tool_response>\n…\n</tool_response><|im_end|>\n
 *    <|im_start|>assistant\n` on Qwen2.5) and tokenized, minus the template's default
 *    system prompt (verl's initialize_system_prompt); they are appended with loss mask 0,
 *    after the generated tokens exactly as the engine returned them (token in, token out:
 *    nothing generated is re-encoded, verl issue #3960); a tool turn that would reach the
 *    response budget ends the trajectory instead.
 */

import type { ToolSchema } from "../text/chat-template.js";
import { type HermesToolCall, parseHermesToolCalls } from "../text/hermes-tool-calls.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import type { TextTokenizer } from "../text/tokenizer.js";
import { parseAction } from "./actions.js";
import type { Passage } from "./observation.js";
import type { RetrieverClient } from "./retriever-client.js";
import { runToolCall, type TruncateSide } from "./search-tool.js";
import type { Trajectory, Turn } from "./trajectory.js";

export interface HermesFormat {
  kind: "hermes";
  /** The schemas the prompt's system turn shows; calls to other names are answered with an error. */
  tools: readonly ToolSchema[];
  /** Model turns at most; null: until the response budget runs out. */
  maxAssistantTurns: number | null;
  maxParallelCalls: number;
  maxToolResponseLength: number;
  truncateSide: TruncateSide;
}

export interface HermesStepParts {
  retriever: Pick<RetrieverClient, "search">;
  tokenizer: Pick<TextTokenizer, "decode">;
  chat: Pick<ModelTokenizer, "encodeChat"> | undefined;
  /** The response budget (all turns together). */
  maxResponseLength: number;
}

export interface HermesStep {
  turn: Turn;
  /** The tool turn's ids to append; null: the trajectory ends here. */
  observationIds: number[] | null;
}

/** Reads the generated turn `index` (already appended to `trajectory`) and answers it. */
export async function hermesStep(
  format: HermesFormat,
  generated: { index: number; ids: readonly number[]; text: string; finish: "stop" | "length" },
  trajectory: Trajectory,
  parts: HermesStepParts,
): Promise<HermesStep> {
  const { calls } = parseHermesToolCalls(
    await parts.tokenizer.decode(generated.ids, false),
    format.maxParallelCalls,
  );
  const answer = parseAction(generated.text);
  const turn: Turn = {
    action: calls.length > 0 ? "search" : answer.kind === "answer" ? "answer" : "invalid",
    query: calls.length > 0 ? JSON.stringify(callQueries(calls)) : answer.content,
    text: generated.text,
    tokens: generated.ids.length,
    finish: generated.finish,
    documents: [],
    observation: "",
    observationTruncated: false,
  };
  trajectory.turns.push(turn);
  const end = (reason: Trajectory["finishReason"]): HermesStep => {
    trajectory.finishReason = reason;
    return { turn, observationIds: null };
  };
  if (trajectory.responseIds.length >= parts.maxResponseLength) return end("max_turns");
  if (format.maxAssistantTurns !== null && generated.index + 1 >= format.maxAssistantTurns) {
    return end(turn.action === "answer" ? "answer" : "max_turns");
  }
  if (calls.length === 0) {
    if (turn.action === "invalid") trajectory.invalidActions++;
    return end(turn.action === "answer" ? "answer" : "no_answer");
  }
  if (!parts.chat) {
    throw new Error(
      "the Hermes format renders tool turns with the model's chat template (AgentParts.chat)",
    );
  }

  const names = new Set(format.tools.map((t) => t.function.name));
  const r0 = performance.now();
  const results = await Promise.all(
    calls.map((call) =>
      runToolCall(
        call,
        names,
        (queries) => Promise.all(queries.map((q) => parts.retriever.search(q))),
        format.maxToolResponseLength,
        format.truncateSide,
      ),
    ),
  );
  trajectory.timing.retrieveMs += performance.now() - r0;
  for (const r of results) {
    trajectory.searches += r.queries.length;
    turn.documents.push(...(r.documents.flat() as Passage[]));
    if (r.truncated) turn.observationTruncated = true;
  }
  const messages = results.map((r) => ({ role: "tool", content: r.text }));
  const rendered = await parts.chat.encodeChat(messages, { addGenerationPrompt: true });
  const ids = rendered.slice(await systemPromptLength(parts.chat));
  if (trajectory.responseIds.length + ids.length >= parts.maxResponseLength) {
    return end("max_turns");
  }
  turn.observation = await parts.tokenizer.decode(ids, false);
  return { turn, observationIds: ids };
}

/** The query lists of the calls, flattened (what the turn searched for, for reports). */
function callQueries(calls: readonly HermesToolCall[]): unknown[] {
  return calls.flatMap((c) => {
    const list = (c.arguments as { query_list?: unknown } | null)?.query_list;
    return Array.isArray(list) ? list : [];
  });
}

const SYSTEM_PROMPTS = new WeakMap<object, Promise<number>>();

/**
 * verl's initialize_system_prompt: the ids a conversation of one empty user message has
 * beyond what a second one adds (`token1[: -(len(token2) - len(token1))]`), i.e. the
 * template's default system turn; their count is cut off the front of each tool turn.
 */
function systemPromptLength(chat: Pick<ModelTokenizer, "encodeChat">): Promise<number> {
  let length = SYSTEM_PROMPTS.get(chat);
  if (!length) {
    const user = { role: "user", content: "" };
    length = Promise.all([
      chat.encodeChat([user], { addGenerationPrompt: false }),
      chat.encodeChat([user, user], { addGenerationPrompt: false }),
    ]).then(([one, two]) => {
      const extra = two.length - one.length;
      // Python's token1[:-0] is empty.
      return extra === 0 ? 0 : Math.max(0, one.length - extra);
    });
    SYSTEM_PROMPTS.set(chat, length);
  }
  return length;
}
