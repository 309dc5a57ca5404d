import type { Passage } from "./observation.js";

/** One model turn and the environment's answer to it. */
export interface Turn {
  action: "search" | "answer" | "invalid";
  /** The search query or the answer (the tag's content, stripped); null for invalid. */
  query: string | null;
  /** What the model generated this turn, decoded without special tokens. */
  text: string;
  /** Tokens generated this turn. */
  tokens: number;
  /** Why the engine stopped: a stop string or EOS (`stop`), or the per-turn budget (`length`). */
  finish: "stop" | "length";
  /** The documents a search returned; empty otherwise (and for a search in the final turn). */
  documents: Passage[];
  /** The text appended after the turn (information block, invalid-action message, or ""). */
  observation: string;
  /** The observation was cut to max_obs_length tokens. */
  observationTruncated: boolean;
}

/**
 * A finished trajectory, token in, token out: `responseIds` are the engine's tokens and the
 * observations' tokens in order; `lossMask` is 1 on generated tokens and 0 on observation
 * tokens; `logprobs` holds the engine's log-prob of each generated token (null on
 * observation tokens, and everywhere when the engine gave none).
 */
export interface Trajectory {
  promptIds: number[];
  responseIds: number[];
  lossMask: number[];
  logprobs: (number | null)[];
  turns: Turn[];
  /** Retriever calls made (a search in the final turn makes none). */
  searches: number;
  invalidActions: number;
  /**
   * `answer`: ended with an answer; `max_turns`: the turn (or, in the Hermes format, the
   * response) budget ran out first; `no_answer` (Hermes format): a turn with neither a
   * tool call nor an answer ended it.
   */
  finishReason: "answer" | "max_turns" | "no_answer";
  /** The prompt was longer than max_start_length and lost its beginning. */
  promptTruncated: boolean;
  /** Turns whose context was left-truncated to max_prompt_length. */
  contextTruncations: number;
  timing: { generateMs: number; retrieveMs: number; totalMs: number };
}
