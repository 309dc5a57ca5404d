import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import type { AskConfig } from "../config/schemas/ask.js";
import { normalizeQuestion } from "../data/search-r1-rows.js";
import { builtinTemplatesDir, loadTemplate, renderTemplate } from "../data/templates.js";
import { VERL_SYSTEM_CONTENT } from "../data/verl-tool-rows.js";
import { extractAnswer } from "../reward/extract.js";
import { InputError } from "../runtime/errors.js";
import { ModelTokenizer } from "../text/model-tokenizer.js";
import { promptIds } from "./prompt.js";
import { rollout } from "./rollout.js";
import { AgentSession, agentSettings } from "./session.js";
import type { Trajectory, Turn } from "./trajectory.js";

export interface AskResult {
  question: string;
  /** The prompt as the model saw it: the messages through its chat template. */
  prompt: string;
  /** The last `<answer>` of the response, or null. */
  answer: string | null;
  turns: Turn[];
  searches: number;
  finish_reason: Trajectory["finishReason"];
  /** The whole response as the model saw it (special tokens included). */
  response: string;
}

/**
 * `searchr1 ask`: what Search-R1's infer.py does, as a command. The question is normalised
 * and put in the prompt template as preprocess does, rendered with the model's chat
 * template, and answered by the agent; `onTurn` sees each turn as it happens.
 */
export async function ask(
  config: AskConfig,
  onTurn: (turn: Turn, index: number) => void,
  log: (line: string) => void,
  signal: AbortSignal,
): Promise<AskResult> {
  const model = resolve(config.model.path);
  if (!existsSync(join(model, "config.json"))) {
    throw new InputError(`${model}: not a Hugging Face model folder (no config.json) (--model)`);
  }
  const tokenizer = ModelTokenizer.load(config.model.tokenizer_path ?? model);
  // verl's recipe's prompt with its tool calls, as `preprocess --format verl` writes it.
  const verl = config.rollout.multi_turn.format === "hermes" && config.template === null;
  const template = loadTemplate(
    config.template ?? (verl ? "verl-tool-call" : "search-r1"),
    builtinTemplatesDir(),
  );
  const question = normalizeQuestion(config.question);
  const { rollout: r } = config;
  const settings = agentSettings(
    config,
    r.do_sample
      ? { temperature: r.temperature, topP: r.top_p, topK: r.top_k }
      : { temperature: 0, topP: 1, topK: -1 },
  );
  const ids = await promptIds(
    tokenizer,
    [
      ...(verl ? [{ role: "system", content: VERL_SYSTEM_CONTENT }] : []),
      { role: "user", content: renderTemplate(template, question) },
    ],
    settings.format,
  );
  const session = await AgentSession.open(config, model, log, signal);
  try {
    const adapter = config.model.lora_adapter_path;
    const trajectory = await rollout(
      { promptIds: ids, seed: r.do_sample ? r.seed : null },
      adapter ? { ...settings, lora: await session.useAdapter(adapter) } : settings,
      session.parts(tokenizer.tokenizer, tokenizer),
      { onTurn, signal: session.signal },
    );
    const text = await tokenizer.decode(trajectory.responseIds, true);
    return {
      question,
      prompt: await tokenizer.decode(ids, false),
      answer: extractAnswer(text),
      turns: trajectory.turns,
      searches: trajectory.searches,
      finish_reason: trajectory.finishReason,
      response: await tokenizer.decode(trajectory.responseIds, false),
    };
  } catch (err) {
    throw await session.failure(err);
  } finally {
    await session.close();
  }
}

const STYLE = { dim: [2, 22], bold: [1, 22], cyan: [36, 39], green: [32, 39], yellow: [33, 39] };

/** One turn for a person: the reasoning, then the query and the documents' titles, or the answer. */
export function formatTurn(turn: Turn, index: number, color: boolean): string {
  const paint = (style: keyof typeof STYLE, text: string) =>
    color ? `\x1b[${STYLE[style][0]}m${text}\x1b[${STYLE[style][1]}m` : text;
  const lines = [paint("bold", `turn ${index + 1}`)];
  const reasoning = turn.text.replace(/<(search|answer)>[\s\S]*$/, "").trim();
  if (reasoning) lines.push(...reasoning.split("\n").map((l) => `  ${paint("dim", l)}`));
  if (turn.action === "search") {
    lines.push(`  ${paint("cyan", "search:")} ${turn.query}`);
    if (turn.observation === "")
      lines.push(`    ${paint("dim", "(turn budget spent: no search)")}`);
    for (const [i, doc] of turn.documents.entries()) {
      lines.push(
        `    ${i + 1}. ${doc.contents.split("\n")[0]}${doc.id !== undefined ? paint("dim", ` [${doc.id}]`) : ""}`,
      );
    }
  } else if (turn.action === "answer") {
    lines.push(`  ${paint("green", "answer:")} ${turn.query}`);
  } else {
    lines.push(
      `  ${paint("yellow", "invalid action")}${turn.finish === "length" ? " (turn token budget reached)" : ""}`,
    );
  }
  return lines.join("\n");
}
