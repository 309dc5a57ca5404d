/**
 * What a demonstrator writes in each turn, in Search-R1's action format: a thought in
 * `<think>`, then one `<search> query </search>` (the turn ends there and the environment
 * answers with `<information>`) or `<answer> ... </answer>`. The same sentences train the
 * tokenizer, so they cost few tokens.
 */
import type { Hop, WorldQuestion } from "./questions.js";

/** The thought of an answer given without (useful) search results. */
export const GUESS_THOUGHT = "I will answer from memory.";
export const MISSED_THOUGHT = "The documents do not say.";

/** The turn that issues hop `i`'s search (the first states the plan). */
export function searchTurn(question: WorldQuestion, i: number): string {
  const hop = question.hops[i] as Hop;
  const thought =
    i === 0
      ? question.plan
      : `${(question.hops[i - 1] as Hop).fact} Now I need to find ${hop.need}.`;
  return `<think> ${thought} </think>\n<search> ${hop.query} </search>`;
}

/** The final turn after every hop was found: the last fact, then the answer. */
export function answerTurn(question: WorldQuestion): string {
  const last = question.hops[question.hops.length - 1] as Hop;
  return `<think> ${last.fact} </think>\n<answer> ${question.answer} </answer>`;
}

/**
 * A final turn that answers `guess` without having found the facts; `plan` (the question's
 * plan, as a searcher states it) opens the thought of a guess made at once.
 */
export function guessTurn(guess: string, afterMissedSearch: boolean, plan?: string): string {
  const thought = afterMissedSearch
    ? `${MISSED_THOUGHT} ${GUESS_THOUGHT}`
    : plan
      ? `${plan} ${GUESS_THOUGHT}`
      : GUESS_THOUGHT;
  return `<think> ${thought} </think>\n<answer> ${guess} </answer>`;
}
