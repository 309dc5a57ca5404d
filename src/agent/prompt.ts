import type { ModelTokenizer } from "../text/model-tokenizer.js";

/**
 * A question's prompt ids as Search-R1's dataset builds them (`rl_dataset.py`): the
 * messages rendered with the model's chat template and an assistant turn opened; a model
 * without a template gets the messages' text as is. Encoded without added special tokens.
 */
export function promptIds(
  tokenizer: ModelTokenizer,
  messages: readonly { role: string; content: string }[],
): Promise<number[]> {
  if (tokenizer.chatTemplate) return tokenizer.encodeChat(messages, { addGenerationPrompt: true });
  return tokenizer.encode(messages.map((m) => m.content).join("\n"), { addSpecialTokens: false });
}
