/**
 * `writeWorld`: the whole tiny world from one seed, as the files the real commands read —
 * a Search-R1 corpus for `build-index`, FlashRAG-layout questions for `preprocess`, and a
 * Hugging Face model folder (tokenizer trained on the world's texts, randomly initialised
 * Qwen2 weights) for `train`, `eval` and the trainer's `sft`. Same seed, same bytes.
 */
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { informationBlock } from "../agent/observation.js";
import { normalizeQuestion } from "../data/search-r1-rows.js";
import {
  builtinTemplatesDir,
  loadTemplate,
  type PromptTemplate,
  renderTemplate,
} from "../data/templates.js";
import { refuseExisting, replaceDir } from "../runtime/replace-dir.js";
import { ChatTemplate } from "../text/chat-template.js";
import { type CorpusRow, corpusJsonl, makeCorpus } from "./corpus.js";
import { DEFAULT_SIZES, makeFacts, type WorldFacts, type WorldSizes } from "./facts.js";
import { DEFAULT_MODEL, parameterCount, type TinyModelOptions, writeTinyModel } from "./model.js";
import { DATA_SOURCES, type DataSource, makeQuestions, type WorldQuestion } from "./questions.js";
import { answerTurn, guessTurn, searchTurn } from "./responses.js";
import { CHAT_TEMPLATE, type TokenIds, trainTokenizer, writeTokenizer } from "./tokenizer.js";

export interface WorldOptions extends WorldSizes {
  seed: number;
  /** Tokens in the tokenizer, its 11 added tokens included. */
  vocabSize: number;
  model: TinyModelOptions;
  /** Prompt template (a built-in name or a file), as `preprocess --template` takes it. */
  template: string;
  /** Replace an existing `dir`; otherwise a non-empty one is refused. */
  overwrite: boolean;
}

export const DEFAULT_WORLD: WorldOptions = {
  seed: 1,
  ...DEFAULT_SIZES,
  vocabSize: 1536,
  model: DEFAULT_MODEL,
  template: "search-r1",
  overwrite: false,
};

/** The files inside a world folder. */
export const WORLD_FILES = {
  /** Facts, questions with their hops, and the options: what writeDemonstrations reads. */
  world: "world.json",
  corpus: "corpus.jsonl",
  /** `<datasets>/<source>/{train,test}.jsonl`: `preprocess <sources> --input <datasets>`. */
  datasets: "datasets",
  /** Hugging Face folder: config, weights, tokenizer. */
  model: "model",
} as const;

/** world.json. */
export interface WorldFile {
  options: Omit<WorldOptions, "overwrite">;
  facts: WorldFacts;
  questions: WorldQuestion[];
}

export interface WorldSummary {
  dir: string;
  worldFile: string;
  corpus: string;
  datasets: string;
  dataSources: readonly DataSource[];
  model: string;
  passages: number;
  questions: Record<DataSource, { train: number; test: number }>;
  tokenIds: TokenIds;
  parameters: number;
}

/** The user message of a question, as `preprocess` writes it into the training parquet. */
export function promptContent(template: PromptTemplate, question: string): string {
  return renderTemplate(template, normalizeQuestion(question));
}

/** The texts the tokenizer learns from: what it will encode in training and evaluation. */
function tokenizerTexts(
  questions: readonly WorldQuestion[],
  corpus: readonly CorpusRow[],
  template: PromptTemplate,
): string[] {
  const chat = new ChatTemplate(CHAT_TEMPLATE, "world chat template");
  const texts: string[] = [];
  for (const q of questions) {
    const content = promptContent(template, q.question);
    texts.push(chat.render([{ role: "user", content }], { addGenerationPrompt: true }));
    q.hops.forEach((_, i) => {
      texts.push(searchTurn(q, i));
    });
    texts.push(answerTurn(q), guessTurn(q.answer, false), guessTurn(q.answer, true));
  }
  for (const row of corpus) texts.push(row.contents);
  // Observations: "Doc 1(Title: ...)" blocks of three passages.
  for (let i = 0; i + 2 < corpus.length; i += 3) {
    texts.push(informationBlock(corpus.slice(i, i + 3)));
  }
  return texts;
}

function datasetJsonl(questions: readonly WorldQuestion[]): string {
  return questions
    .map(
      (q) => `${JSON.stringify({ id: q.id, question: q.question, golden_answers: [q.answer] })}\n`,
    )
    .join("");
}

/**
 * Writes the world into `dir` (see WORLD_FILES), everything into a temporary folder
 * first that replaces `dir` only when complete.
 */
export async function writeWorld(
  dir: string,
  options: Partial<Omit<WorldOptions, "model">> & { model?: Partial<TinyModelOptions> } = {},
): Promise<WorldSummary> {
  const o: WorldOptions = {
    ...DEFAULT_WORLD,
    ...options,
    model: { ...DEFAULT_WORLD.model, ...options.model },
  };
  const out = resolve(dir);
  await refuseExisting(out, o.overwrite);
  const template = loadTemplate(o.template, builtinTemplatesDir());
  const facts = makeFacts(o.seed, o);
  const questions = makeQuestions(facts);
  const corpus = makeCorpus(facts);
  const tokenizer = trainTokenizer(
    tokenizerTexts(questions, corpus, template),
    o.vocabSize,
    o.model.maxPositions,
  );

  const tmp = `${out}.partial-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  try {
    const modelDir = join(tmp, WORLD_FILES.model);
    await mkdir(modelDir, { recursive: true });
    const { overwrite: _, ...kept } = o;
    const file: WorldFile = { options: kept, facts, questions };
    await writeFile(join(tmp, WORLD_FILES.world), `${JSON.stringify(file, null, 2)}\n`);
    await writeFile(join(tmp, WORLD_FILES.corpus), corpusJsonl(corpus));
    const counts = {} as WorldSummary["questions"];
    for (const source of DATA_SOURCES) {
      const sourceDir = join(tmp, WORLD_FILES.datasets, source);
      await mkdir(sourceDir, { recursive: true });
      counts[source] = { train: 0, test: 0 };
      for (const split of ["train", "test"] as const) {
        const chosen = questions.filter((q) => q.dataSource === source && q.split === split);
        counts[source][split] = chosen.length;
        await writeFile(join(sourceDir, `${split}.jsonl`), datasetJsonl(chosen));
      }
    }
    await writeTokenizer(modelDir, tokenizer);
    // A seed of its own, so that changing the world's sizes keeps the weights' stream apart.
    const shape = await writeTinyModel(modelDir, o.model, tokenizer.ids, (o.seed ^ 0x5eed) >>> 0);
    await replaceDir(tmp, out);
    return {
      dir: out,
      worldFile: join(out, WORLD_FILES.world),
      corpus: join(out, WORLD_FILES.corpus),
      datasets: join(out, WORLD_FILES.datasets),
      dataSources: DATA_SOURCES,
      model: join(out, WORLD_FILES.model),
      passages: corpus.length,
      questions: counts,
      tokenIds: tokenizer.ids,
      parameters: parameterCount(shape),
    };
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }
}

/** Reads a world folder's world.json. */
export async function readWorld(dir: string): Promise<WorldFile> {
  return JSON.parse(await readFile(join(dir, WORLD_FILES.world), "utf8")) as WorldFile;
}
