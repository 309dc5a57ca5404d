/**
 * The text the environment answers a turn with, exactly as Search-R1 writes it
 * (Search-R1 search_r1/llm_agent/generation.py: LLMGenerationManager.execute_predictions,
 * postprocess_predictions and _passages2string). These strings are the protocol between a trained model and its
 * environment: a model trained with the original expects them byte for byte.
 */
import { pythonStrip } from "../text/python-string.js";

/** A retrieved document as the retriever returns it (`contents` = `"Title"\ntext`). */
export interface Passage {
  id?: string;
  contents: string;
}

/** What an invalid action (no `<search>` or `<answer>` pair) is answered with. */
export const INVALID_ACTION_MESSAGE =
  "\nMy previous action is invalid. If I want to search, I should put the query between " +
  "<search> and </search>. If I want to give the final answer, I should put the answer " +
  "between <answer> and </answer>. Let me try again.\n";

/**
 * `Doc i(Title: <first line>) <rest>\n` per document, i from 1, no space before "(": the
 * title keeps the corpus's quotes, as `_passages2string` does with `contents.split("\n")`.
 */
export function passagesToString(passages: readonly Passage[]): string {
  let out = "";
  passages.forEach((passage, i) => {
    const [title, ...rest] = passage.contents.split("\n");
    out += `Doc ${i + 1}(Title: ${title}) ${rest.join("\n")}\n`;
  });
  return out;
}

/** The observation after a search: the documents inside `<information>`, stripped. */
export function informationBlock(passages: readonly Passage[]): string {
  return `\n\n<information>${pythonStrip(passagesToString(passages))}</information>\n\n`;
}
