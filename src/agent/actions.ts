/**
 * Reading a turn's action, as Search-R1's `postprocess_predictions` does: the first
 * `<search>…</search>` or `<answer>…</answer>` pair of the turn's text (same tag on both
 * sides, content across lines), its content stripped. No pair is an invalid action.
 */
import { pythonStrip } from "../text/python-string.js";

export type Action =
  | { kind: "search"; content: string }
  | { kind: "answer"; content: string }
  | { kind: "invalid"; content: null };

/** Generation stops at the first of these (the engine's stop strings). */
export const STOP_STRINGS = ["</search>", "</answer>"] as const;

const ACTION = /<(search|answer)>([\s\S]*?)<\/\1>/;

export function parseAction(text: string): Action {
  const match = ACTION.exec(text);
  if (!match) return { kind: "invalid", content: null };
  return { kind: match[1] as "search" | "answer", content: pythonStrip(match[2] as string) };
}

/**
 * Search-R1's cut of a turn's decoded text (`_postprocess_responses`): up to the first
 * `</search>` if there is one, else up to the first `</answer>`, else all of it. Used only
 * by `--compat search-r1-retokenize`; the engine's stop strings make it a no-op otherwise.
 */
export function cutAtAction(text: string): string {
  for (const tag of ["</search>", "</answer>"]) {
    const at = text.indexOf(tag);
    if (at >= 0) return text.slice(0, at + tag.length);
  }
  return text;
}
