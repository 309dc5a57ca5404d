import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import {
  agentEnv,
  decodingFields,
  generationFields,
  lengthFields,
  modelCompat,
  modelSection,
  retrieverSection,
  servedAdapterField,
} from "./shared.js";

export const askSchema = z.strictObject({
  question: z.string().min(1).describe("the question to answer"),
  model: modelSection.extend(servedAdapterField),
  template: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "prompt template: a built-in name (templates/*.txt) or a file with {question} (null: search-r1, or with rollout.multi_turn.format hermes verl-tool-call after verl's system message, as preprocess --format verl writes the prompt)",
    ),
  data: z.strictObject({ ...lengthFields }).prefault({}),
  rollout: z.strictObject({ ...generationFields, ...decodingFields }).prefault({}),
  retriever: retrieverSection.prefault({}),
  json: z
    .boolean()
    .default(false)
    .describe("print one JSON object (for scripts) instead of the turns"),
});

export type AskConfig = z.infer<typeof askSchema>;

export const askSpec: CommandConfigSpec<typeof askSchema> = {
  command: "ask",
  schema: askSchema,
  compat: modelCompat,
  env: agentEnv,
};
