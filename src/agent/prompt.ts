import { InputError } from "../runtime/errors.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import type { AgentSettings } from "./rollout.js";

/**
 * A question's prompt ids as Search-R1's dataset builds them (`rl_dataset.py`): the
 * messages rendered with the model's chat template and an assistant turn opened; a model
 * without a template gets the messages' text as is. Encoded without added special tokens.
 * In the Hermes format the template is also given the tools (verl's ToolAgentLoop:
 * `apply_chat_template(messages, tools=tool_schemas, add_generation_prompt=True)`), which
 * Qwen2.5's template writes into the system turn.
 */
export function promptIds(
  tokenizer: ModelTokenizer,
  messages: readonly { role: string; content: string }[],
  format: AgentSettings["format"] = { kind: "search_r1" },
): Promise<number[]> {
  if (format?.kind === "hermes") {
    if (!tokenizer.chatTemplate) {
      throw new InputError(
        `${tokenizer.dir}: rollout.multi_turn.format=hermes needs the model's chat template (none found)`,
      );
    }
    return tokenizer.encodeChat(messages, { addGenerationPrompt: true, tools: format.tools });
  }
  if (tokenizer.chatTemplate) return tokenizer.encodeChat(messages, { addGenerationPrompt: true });
  return tokenizer.encode(messages.map((m) => m.content).join("\n"), { addSpecialTokens: false });
}
