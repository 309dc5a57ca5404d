import { promptIds } from "../agent/prompt.js";
import { type AgentParts, type AgentSettings, rolloutAll } from "../agent/rollout.js";
import type { QaItem } from "../data/qa-items.js";
import type { RewardConfig } from "../reward/score.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import { type EvalRecord, toRecord } from "./record.js";

export interface AnswerOptions {
  settings: AgentSettings;
  /** Questions in flight at once. */
  concurrency: number;
  /** Question i samples with seed + i; null when greedy. */
  seed: number | null;
  reward: Pick<RewardConfig, "search_r1_extract">;
  signal?: AbortSignal;
  /** Each question's record as it finishes. */
  onRecord?: (record: EvalRecord) => void;
}

/**
 * The agent on a list of questions, each scored into its record: what `eval` does over a
 * test set and `train` over its validation set.
 */
export async function answerItems(
  items: readonly QaItem[],
  tokenizer: ModelTokenizer,
  parts: Omit<AgentParts, "tokenizer">,
  options: AnswerOptions,
): Promise<EvalRecord[]> {
  const tasks = await Promise.all(
    items.map(async (item, i) => ({
      promptIds: await promptIds(tokenizer, item.messages, options.settings.format),
      seed: options.seed === null ? null : options.seed + i,
    })),
  );
  const records: EvalRecord[] = new Array(items.length);
  await rolloutAll(
    tasks,
    options.settings,
    { ...parts, tokenizer: tokenizer.tokenizer, chat: tokenizer },
    {
      concurrency: options.concurrency,
      signal: options.signal,
      onDone: async (trajectory, i) => {
        const record = await toRecord(
          items[i] as QaItem,
          trajectory,
          tokenizer.tokenizer,
          options.reward,
        );
        records[i] = record;
        options.onRecord?.(record);
      },
    },
  );
  return records;
}
