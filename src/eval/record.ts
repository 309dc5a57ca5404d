import type { Trajectory } from "../agent/trajectory.js";
import type { QaItem } from "../data/qa-items.js";
import { type RewardConfig, scoreTrajectory } from "../reward/score.js";
import type { TextTokenizer } from "../text/tokenizer.js";

/** One line of `trajectories.jsonl`: a question, what the agent did, and how it scored. */
export interface EvalRecord {
  id: string;
  data_source: string;
  question: string;
  golden_answers: string[];
  /** The extracted answer, or null when there is none. */
  prediction: string | null;
  em: number;
  subem: number;
  f1: number;
  /** The whole response as the model saw it: generated text, tags and information blocks. */
  response: string;
  turns: {
    action: "search" | "answer" | "invalid";
    query: string | null;
    documents: { id: string | null; contents: string }[];
    observation: string;
  }[];
  searches: number;
  invalid_actions: number;
  response_tokens: number;
  finish_reason: "answer" | "max_turns" | "no_answer";
}

/** Scores a trajectory (exact match, sub-EM, F1 of the extracted answer) into its record. */
export async function toRecord(
  item: QaItem,
  trajectory: Trajectory,
  tokenizer: Pick<TextTokenizer, "decode">,
  reward: Pick<RewardConfig, "search_r1_extract">,
): Promise<EvalRecord> {
  const [response, responseText, promptText] = await Promise.all([
    tokenizer.decode(trajectory.responseIds, false),
    tokenizer.decode(trajectory.responseIds, true),
    reward.search_r1_extract ? tokenizer.decode(trajectory.promptIds, false) : "",
  ]);
  const score = scoreTrajectory(
    { promptText, responseText, golds: item.golds },
    {
      ...reward,
      format_reward: false,
      structure_format_score: 0,
      final_format_score: 0,
      retrieval_score: 0,
    },
  );
  return {
    id: item.id,
    data_source: item.dataSource,
    question: item.question,
    golden_answers: item.golds,
    prediction: score.prediction,
    em: score.em,
    subem: score.subem,
    f1: score.f1,
    response,
    turns: trajectory.turns.map((t) => ({
      action: t.action,
      query: t.query,
      documents: t.documents.map((d) => ({ id: d.id ?? null, contents: d.contents })),
      observation: t.observation,
    })),
    searches: trajectory.searches,
    invalid_actions: trajectory.invalidActions,
    response_tokens: trajectory.responseIds.length,
    finish_reason: trajectory.finishReason,
  };
}
