import {
  boolean,
  groundTruth,
  int64,
  promptColumn,
  rewardModelColumn,
  rootSchema,
  string,
  struct,
} from "./parquet-schema.js";
import type { RowFormat } from "./search-r1-rows.js";
import { renderTemplate } from "./templates.js";

/**
 * verl's system message for its Search-R1-like recipe (volcengine/verl,
 * examples/data_preprocess/preprocess_search_r1_dataset.py, DEFAULT_SYSTEM_CONTENT).
 */
export const VERL_SYSTEM_CONTENT = "You are a helpful and harmless assistant.";

/**
 * One row as verl's preprocess_search_r1_dataset.py writes it from Search-R1's parquet, for
 * rollout.multi_turn.format: hermes: a system message, the `<tool_call>` instruction, the
 * source prefixed `searchR1_` (verl's reward routing), and the search tool's create_kwargs.
 * Field order is verl's (its pd.Series), which is the parquet column order.
 */
export interface VerlToolRow {
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: { target: string[] } };
  extra_info: {
    /** The row's position in the output file (verl: `row.name` of the merged DataFrame). */
    index: number;
    need_tools_kwargs: boolean;
    question: string;
    split: string;
    tools_kwargs: {
      search: {
        create_kwargs: {
          ground_truth: { target: string[] };
          question: string;
          data_source: string;
        };
      };
    };
  };
  /** verl copies the input's `metadata`; Search-R1's parquet has none, so it is null. */
  metadata: null;
}

export const VERL_TOOL_ROWS: RowFormat<VerlToolRow> = {
  schema: rootSchema([
    [string("data_source")],
    promptColumn(),
    [string("ability")],
    rewardModelColumn(),
    struct("extra_info", [
      [int64("index")],
      [boolean("need_tools_kwargs")],
      [string("question")],
      [string("split")],
      struct("tools_kwargs", [
        struct("search", [
          struct("create_kwargs", [groundTruth(), [string("question")], [string("data_source")]]),
        ]),
      ]),
    ]),
    [string("metadata", "OPTIONAL")],
  ]),
  build: ({ question, golden }, ctx) => {
    const dataSource = `searchR1_${ctx.dataSource}`;
    const groundTruth = { target: golden };
    return {
      data_source: dataSource,
      prompt: [
        { role: "system", content: VERL_SYSTEM_CONTENT },
        // verl: user_content_prefix.rstrip("\n") + question.
        { role: "user", content: renderTemplate(ctx.template, question) },
      ],
      ability: "fact-reasoning",
      reward_model: { style: "rule", ground_truth: groundTruth },
      extra_info: {
        index: ctx.row,
        need_tools_kwargs: true,
        question,
        split: ctx.split,
        tools_kwargs: {
          search: {
            create_kwargs: { ground_truth: groundTruth, question, data_source: dataSource },
          },
        },
      },
      metadata: null,
    };
  },
  columns: (rows) => [
    { name: "data_source", data: rows.map((r) => r.data_source) },
    { name: "prompt", data: rows.map((r) => r.prompt), statistics: false },
    { name: "ability", data: rows.map((r) => r.ability) },
    { name: "reward_model", data: rows.map((r) => r.reward_model) },
    {
      name: "extra_info",
      data: rows.map(({ extra_info: e }) => ({ ...e, index: BigInt(e.index) })),
    },
    { name: "metadata", data: rows.map((r) => r.metadata) },
  ],
};
