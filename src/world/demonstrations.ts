/**
 * SFT demonstrations of mixed quality for the warm start: for each training question
 * either a searcher (one search per hop, then the answer it read) or a guesser (an answer
 * of the right kind, drawn at random, with no search). Trajectories are built as the agent
 * builds them, token in and token out: the chat-rendered prompt's ids, then each generated
 * turn and each observation encoded on its own without special tokens, concatenated. The
 * observations are `informationBlock` of real BM25 top-k results over the world's corpus.
 */
import { mkdir, rename, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { informationBlock } from "../agent/observation.js";
import { builtinTemplatesDir, loadTemplate, type PromptTemplate } from "../data/templates.js";
import { Rng } from "../runtime/rng.js";
import { ModelTokenizer } from "../text/model-tokenizer.js";
import { shuffle, type WorldFacts } from "./facts.js";
import type { EntityKind } from "./names.js";
import type { WorldQuestion } from "./questions.js";
import { answerTurn, guessTurn, searchTurn } from "./responses.js";
import { openIndexSearch, type PassageSearch } from "./search.js";
import { writeSftFile } from "./sft-file.js";
import { promptContent, readWorld, WORLD_FILES } from "./world.js";

/**
 * search: searched every hop and answered from what it read; guess: answered at once;
 * missed: searched, did not find a hop's fact in the results, then guessed.
 */
export type DemonstrationKind = "search" | "guess" | "missed";

export interface Demonstration {
  id: string;
  dataSource: string;
  question: string;
  answer: string;
  kind: DemonstrationKind;
  /** The chat-rendered prompt. */
  prompt: string;
  /** Everything after the prompt: generated turns and observations, then `<|im_end|>`. */
  response: string;
  ids: number[];
  /**
   * 1 on the trained tokens: the generated ones (the final `<|im_end|>` included) except a
   * guess's name; 0 on prompt and observations.
   */
  lossMask: number[];
  searches: number;
}

export interface DemonstrationOptions {
  /** Share of questions answered by the guesser. */
  guessFraction: number;
  /** Passages per search, as the agent's retriever.topk. */
  topk: number;
  /**
   * A guesser first states the question's plan, as a searcher does: every demonstration
   * practises copying the question's name, and the choice to search or guess comes after.
   */
  planBeforeGuess: boolean;
  /** Default: the world's seed. */
  seed?: number;
}

/**
 * Mostly guessers, so that the warm start answers from memory when decoding greedily and
 * searches in about a quarter of its samples; one passage per search, as the quickstart's
 * agent gets (retriever.topk=1): the fact to copy is then the only one of its kind in sight.
 */
export const DEFAULT_DEMONSTRATIONS: DemonstrationOptions = {
  guessFraction: 0.7,
  topk: 1,
  planBeforeGuess: true,
};

/**
 * A prompt of the question alone, for the copy-school demonstrations (all searchers): a
 * third of the tokens of Search-R1's prompt, so the tiny model gets many cheap steps of
 * copying names from the question and the passages before it meets the real prompt (the
 * question ends both prompts, so what it copies sits at the same distance).
 */
export const QUESTION_ONLY_TEMPLATE: PromptTemplate = {
  name: "question-only",
  file: "(built into the quickstart)",
  text: "Question: {question}",
};

function namesOf(facts: WorldFacts): Record<EntityKind, string[]> {
  return {
    person: facts.people.map((p) => p.name),
    city: facts.cities.map((c) => c.name),
    country: facts.countries,
    organisation: facts.organisations.map((o) => o.name),
  };
}

/**
 * One demonstration per training question, in a seeded order mixing both sources. `search`
 * answers the searcher's queries; `tokenizer` is the world model's.
 */
export async function buildDemonstrations(
  world: { facts: WorldFacts; questions: readonly WorldQuestion[]; template: PromptTemplate },
  tokenizer: ModelTokenizer,
  search: PassageSearch,
  options: DemonstrationOptions,
): Promise<Demonstration[]> {
  const { guessFraction, topk } = options;
  if (!(guessFraction >= 0 && guessFraction <= 1)) {
    throw new RangeError(`guessFraction: expected a number in [0, 1], got ${guessFraction}`);
  }
  const eos = tokenizer.tokenizer.tokenToId("<|im_end|>");
  if (eos === null) throw new Error(`${tokenizer.dir}: the tokenizer has no <|im_end|>`);
  const rng = new Rng(((options.seed ?? world.facts.seed) ^ 0xde30) >>> 0);
  const names = namesOf(world.facts);
  const train = shuffle(
    rng,
    world.questions.filter((q) => q.split === "train"),
  );
  const out: Demonstration[] = [];
  for (const q of train) {
    const prompt = tokenizer.applyChatTemplate(
      [{ role: "user", content: promptContent(world.template, q.question) }],
      { addGenerationPrompt: true },
    );
    const ids = await tokenizer.encode(prompt, { addSpecialTokens: false });
    const lossMask: number[] = ids.map(() => 0);
    let response = "";
    const append = async (text: string, trained: boolean) => {
      const piece = await tokenizer.encode(text, { addSpecialTokens: false });
      ids.push(...piece);
      for (const _ of piece) lossMask.push(trained ? 1 : 0);
      response += text;
    };
    // A guess's name is noise: the warm start learns when to guess, and the answer's format,
    // but never to write a random name where an answer goes (its tokens are not trained).
    // The cut falls where the tokenizer splits anyway (before a space and an added token).
    const appendGuess = async (afterMissedSearch: boolean, plan?: string) => {
      const pool = names[q.answerKind];
      const name = pool[rng.int(pool.length)] as string;
      const turn = guessTurn(name, afterMissedSearch, plan);
      const at = turn.lastIndexOf(` ${name} </answer>`);
      await append(turn.slice(0, at), true);
      await append(` ${name}`, false);
      await append(turn.slice(at + name.length + 1), true);
    };

    let kind: DemonstrationKind = rng.uniform() < guessFraction ? "guess" : "search";
    let searches = 0;
    if (kind === "guess") {
      await appendGuess(false, options.planBeforeGuess ? q.plan : undefined);
    } else {
      for (const [i, hop] of q.hops.entries()) {
        await append(searchTurn(q, i), true);
        const [passages = []] = await search.search([hop.query], topk);
        const observation = informationBlock(passages);
        await append(observation, false);
        searches++;
        if (!observation.includes(hop.fact)) {
          kind = "missed";
          break;
        }
      }
      if (kind === "search") await append(answerTurn(q), true);
      else await appendGuess(true);
    }
    ids.push(eos);
    lossMask.push(1);
    response += "<|im_end|>";
    out.push({
      id: q.id,
      dataSource: q.dataSource,
      question: q.question,
      answer: q.answer,
      kind,
      prompt,
      response,
      ids,
      lossMask,
      searches,
    });
  }
  return out;
}

export interface DemonstrationSummary {
  /** The trainer's SFT file (`searchr1-trainer sft --data`). */
  safetensors: string;
  /** The same demonstrations as text, one JSON object per line, for people. */
  jsonl: string;
  rows: number;
  kinds: Record<DemonstrationKind, number>;
  /** Longest trajectory (the file's T) and the mean, in tokens. */
  maxTokens: number;
  meanTokens: number;
}

export const DEMONSTRATION_FILES = {
  safetensors: "demonstrations.safetensors",
  jsonl: "demonstrations.jsonl",
} as const;

/**
 * Builds the demonstrations of the world in `worldDir`, searching the BM25 index that
 * `searchr1 build-index --corpus <worldDir>/corpus.jsonl` built in `indexDir`, and writes
 * them into `outDir` (default `<worldDir>/sft`).
 */
export async function writeDemonstrations(
  worldDir: string,
  indexDir: string,
  options: Partial<DemonstrationOptions> & { outDir?: string; template?: PromptTemplate } = {},
): Promise<DemonstrationSummary> {
  const o = { ...DEFAULT_DEMONSTRATIONS, ...options };
  const file = await readWorld(worldDir);
  const template = o.template ?? loadTemplate(file.options.template, builtinTemplatesDir());
  const modelDir = join(worldDir, WORLD_FILES.model);
  const tokenizer = ModelTokenizer.load(modelDir);
  const search = await openIndexSearch(indexDir, join(worldDir, WORLD_FILES.corpus));
  let demos: Demonstration[];
  try {
    demos = await buildDemonstrations(
      { facts: file.facts, questions: file.questions, template },
      tokenizer,
      search,
      o,
    );
  } finally {
    await search.close();
  }

  const padId = tokenizer.tokenizer.tokenToId("<|endoftext|>") ?? 0;
  const outDir = resolve(o.outDir ?? join(worldDir, "sft"));
  await mkdir(outDir, { recursive: true });
  const safetensors = join(outDir, DEMONSTRATION_FILES.safetensors);
  const jsonl = join(outDir, DEMONSTRATION_FILES.jsonl);
  const maxTokens = await writeSftFile(safetensors, demos, padId, file.options.model.maxPositions);
  const lines = demos.map((d) =>
    JSON.stringify({
      id: d.id,
      data_source: d.dataSource,
      question: d.question,
      golden_answers: [d.answer],
      kind: d.kind,
      searches: d.searches,
      tokens: d.ids.length,
      prompt: d.prompt,
      response: d.response,
    }),
  );
  const tmp = `${jsonl}.tmp-${process.pid}`;
  await writeFile(tmp, `${lines.join("\n")}\n`);
  await rename(tmp, jsonl);

  const kinds: Record<DemonstrationKind, number> = { search: 0, guess: 0, missed: 0 };
  for (const d of demos) kinds[d.kind]++;
  const total = demos.reduce((n, d) => n + d.ids.length, 0);
  return {
    safetensors,
    jsonl,
    rows: demos.length,
    kinds,
    maxTokens,
    meanTokens: demos.length === 0 ? 0 : total / demos.length,
  };
}
