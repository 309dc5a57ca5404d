import { appendFileSync, existsSync, mkdirSync, readFileSync, truncateSync } from "node:fs";
import { join, resolve } from "node:path";
import { AgentSession, agentSettings } from "../agent/session.js";
import type { EvalConfig } from "../config/schemas/eval.js";
import { firstPerSource, type QaItem, readQaItems } from "../data/qa-items.js";
import { InputError, UsageError } from "../runtime/errors.js";
import type { Progress } from "../runtime/progress.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import { ModelTokenizer } from "../text/model-tokenizer.js";
import { answerItems } from "./answer-items.js";
import type { EvalRecord } from "./record.js";
import { type Report, reportMarkdown, summarize } from "./report.js";

export const TRAJECTORIES = "trajectories.jsonl";

/**
 * `searchr1 eval`: runs the agent on every selected question (greedy unless do_sample),
 * appends each scored trajectory to `trajectories.jsonl` as it finishes, and writes
 * `report.json` and `report.md` from the whole file at the end. A re-run with the same
 * output folder skips the questions already there, so an interrupted run resumes.
 */
export async function runEval(
  config: EvalConfig,
  progress: Progress,
  signal: AbortSignal,
): Promise<Report> {
  if (config.model.path === null) {
    throw new UsageError(
      'missing required key "model.path": set it with --model (or use --compare)',
    );
  }
  if (config.gpus > 1) {
    throw new UsageError(
      `gpus=${config.gpus}: eval runs one engine on one device in this build; ` +
        "set --gpus 1, or serve a multi-GPU SGLang/vLLM server and pass --engine-url",
    );
  }
  const model = resolve(config.model.path);
  if (!existsSync(join(model, "config.json"))) {
    throw new InputError(`${model}: not a Hugging Face model folder (no config.json) (--model)`);
  }
  const tokenizer = ModelTokenizer.load(config.model.tokenizer_path ?? model);
  const items = selectItems(await readQaItems(config.data.val_files), config);

  const out = resolve(config.output_dir);
  mkdirSync(out, { recursive: true });
  const file = join(out, TRAJECTORIES);
  const previous = readRecords(file);
  const todo = pendingItems(items, previous);
  progress.log(
    previous.length
      ? `resuming in ${out}: ${items.length - todo.length} of ${items.length} questions already done`
      : `evaluating ${items.length} questions into ${out}`,
  );

  if (todo.length > 0) {
    await evaluate(
      todo,
      items.length - todo.length,
      items.length,
      config,
      model,
      tokenizer,
      file,
      progress,
      signal,
    );
  }
  const wanted = new Set(items.map((i) => `${i.dataSource}/${i.id}`));
  const records = readRecords(file).filter((r) => wanted.has(`${r.data_source}/${r.id}`));
  const report = summarize(records, reportConfig(config, model));
  writeFileAtomic(join(out, "report.json"), `${JSON.stringify(report, null, 2)}\n`);
  writeFileAtomic(join(out, "report.md"), reportMarkdown(report));
  return report;
}

async function evaluate(
  todo: QaItem[],
  alreadyDone: number,
  total: number,
  config: EvalConfig,
  model: string,
  tokenizer: ModelTokenizer,
  file: string,
  progress: Progress,
  signal: AbortSignal,
): Promise<void> {
  const { rollout, data } = config;
  const settings = agentSettings(
    config,
    rollout.do_sample
      ? { temperature: rollout.temperature, topP: rollout.top_p, topK: rollout.top_k }
      : { temperature: 0, topP: 1, topK: -1 },
  );
  const session = await AgentSession.open(config, model, (line) => progress.log(line), signal);

  const task = progress.task("eval", total, "questions");
  let done = alreadyDone;
  let em = 0;
  let scored = 0;
  try {
    const adapter = config.model.lora_adapter_path;
    await answerItems(todo, tokenizer, session.parts(tokenizer.tokenizer), {
      settings: adapter ? { ...settings, lora: await session.useAdapter(adapter) } : settings,
      concurrency: data.val_batch_size,
      seed: rollout.do_sample ? rollout.seed + alreadyDone : null,
      reward: config.reward,
      signal: session.signal,
      onRecord: (record) => {
        // One write per line: an interruption leaves whole lines (a torn last line is dropped on resume).
        appendFileSync(file, `${JSON.stringify(record)}\n`);
        done++;
        scored++;
        em += record.em;
        task.update(done, `EM ${(em / scored).toFixed(3)}`);
      },
    });
    task.finish();
  } catch (err) {
    task.finish();
    throw await session.failure(err);
  } finally {
    await session.close();
  }
}

/** The questions of the chosen sources, max_samples per source, then the first `limit`. */
function selectItems(items: QaItem[], config: EvalConfig): QaItem[] {
  const { sources, max_samples, limit } = config.data;
  let chosen = items;
  if (sources) {
    const present = new Set(items.map((i) => i.dataSource));
    const unknown = sources.filter((s) => !present.has(s));
    if (unknown.length) {
      throw new UsageError(
        `data.sources (--sources): ${unknown.join(", ")} not in ${config.data.val_files.join(", ")}; ` +
          `they hold ${[...present].sort().join(", ")}`,
      );
    }
    chosen = chosen.filter((i) => sources.includes(i.dataSource));
  }
  if (max_samples !== null) chosen = firstPerSource(chosen, max_samples);
  if (limit !== null) chosen = chosen.slice(0, limit);
  if (chosen.length === 0)
    throw new InputError("no questions selected: check data.sources, max_samples, limit");
  return chosen;
}

/** The items without a record yet (a question asked twice needs two records). */
function pendingItems(items: QaItem[], records: readonly EvalRecord[]): QaItem[] {
  const have = new Map<string, number>();
  for (const r of records) {
    const key = `${r.data_source}/${r.id}`;
    have.set(key, (have.get(key) ?? 0) + 1);
  }
  return items.filter((i) => {
    const key = `${i.dataSource}/${i.id}`;
    const n = have.get(key) ?? 0;
    if (n > 0) have.set(key, n - 1);
    return n === 0;
  });
}

/**
 * The records of a trajectories.jsonl; a last line cut short by an interruption is removed
 * from the file (its question runs again). Any other bad line is an InputError.
 */
export function readRecords(file: string): EvalRecord[] {
  if (!existsSync(file)) return [];
  const text = readFileSync(file, "utf8");
  const lines = text.split("\n");
  const records: EvalRecord[] = [];
  let offset = 0;
  for (const [n, line] of lines.entries()) {
    const last = n === lines.length - 1;
    if (line.trim() !== "") {
      try {
        records.push(JSON.parse(line) as EvalRecord);
      } catch {
        if (!last) throw new InputError(`${file}:${n + 1}: not a JSON line of a searchr1 eval`);
        truncateSync(file, Buffer.byteLength(text.slice(0, offset)));
      }
    }
    offset += line.length + 1;
  }
  return records;
}

function reportConfig(config: EvalConfig, model: string): Record<string, unknown> {
  return {
    model,
    ...(config.model.lora_adapter_path && {
      lora_adapter: resolve(config.model.lora_adapter_path),
    }),
    data: config.data.val_files,
    engine: config.rollout.engine_url ?? config.rollout.engine,
    retriever: config.retriever.url,
    topk: config.retriever.topk,
    max_turns: config.rollout.max_turns,
    sampling: config.rollout.do_sample
      ? {
          temperature: config.rollout.temperature,
          top_p: config.rollout.top_p,
          top_k: config.rollout.top_k,
          seed: config.rollout.seed,
        }
      : "greedy",
    compat: config.rollout.compat,
    search_r1_extract: config.reward.search_r1_extract,
  };
}
