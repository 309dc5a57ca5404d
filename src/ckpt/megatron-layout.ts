/**
 * Where the rank files of a Megatron-LM `torch`-format checkpoint are:
 * `<root>/latest_checkpointed_iteration.txt` names `iter_XXXXXXX` (or `release`), which
 * holds `mp_rank_XX/` (pipeline size 1) or `mp_rank_XX_YYY/` folders, one per
 * tensor-parallel rank XX and pipeline stage YYY, each with `model_optim_rng.pt`.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { InputError } from "../runtime/errors.js";

export interface MegatronLayout {
  iterDir: string;
  tp: number;
  pp: number;
  /** files[stage][tpRank] */
  files: string[][];
}

const TRACKER = "latest_checkpointed_iteration.txt";
const RANK_DIR = /^mp_rank_(\d{2})(?:_(\d{3}))?$/;
const RANK_FILES = ["model_optim_rng.pt", "model_rng.pt", "model.pt"];

export function locateMegatron(input: string): MegatronLayout {
  const iterDir = findIterationDir(input);
  const ranks = subdirs(iterDir).filter((d) => d.startsWith("mp_rank_"));
  if (ranks.length === 0) throw new InputError(`${iterDir}: no mp_rank_XX folders`);
  let tp = 0;
  let pp = 0;
  const withStage = new Set<boolean>();
  for (const d of ranks) {
    const m = RANK_DIR.exec(d);
    if (!m) {
      throw new InputError(
        `${join(iterDir, d)}: unsupported rank folder (expert-parallel checkpoints are not supported)`,
      );
    }
    withStage.add(m[2] !== undefined);
    tp = Math.max(tp, Number(m[1]) + 1);
    pp = Math.max(pp, Number(m[2] ?? 0) + 1);
  }
  if (withStage.size > 1) {
    throw new InputError(`${iterDir}: mixes mp_rank_XX and mp_rank_XX_YYY folders`);
  }
  const staged = withStage.has(true);
  const files: string[][] = [];
  for (let p = 0; p < pp; p++) {
    const row: string[] = [];
    for (let t = 0; t < tp; t++) {
      const dir = join(
        iterDir,
        `mp_rank_${String(t).padStart(2, "0")}${staged ? `_${String(p).padStart(3, "0")}` : ""}`,
      );
      if (!existsSync(dir)) {
        throw new InputError(`${dir}: missing (tensor-parallel size ${tp}, pipeline size ${pp})`);
      }
      const file = RANK_FILES.map((f) => join(dir, f)).find((f) => existsSync(f));
      if (!file) throw new InputError(`${dir}: no ${RANK_FILES.join(" / ")}`);
      row.push(file);
    }
    files.push(row);
  }
  return { iterDir, tp, pp, files };
}

/** The checkpoint root (tracker file), an iteration folder, or a folder with exactly one. */
function findIterationDir(input: string): string {
  if (!existsSync(input) || !statSync(input).isDirectory()) {
    throw new InputError(`${input}: no such checkpoint folder`);
  }
  const tracker = join(input, TRACKER);
  if (existsSync(tracker)) {
    const text = readFileSync(tracker, "utf8").trim();
    const name =
      text === "release" ? "release" : /^\d+$/.test(text) ? `iter_${text.padStart(7, "0")}` : "";
    if (!name)
      throw new InputError(`${tracker}: expected an iteration number or "release", got "${text}"`);
    const dir = join(input, name);
    if (!existsSync(dir)) throw new InputError(`${dir}: missing (named by ${tracker})`);
    return dir;
  }
  const entries = subdirs(input);
  if (entries.some((d) => d.startsWith("mp_rank_"))) return input;
  const iters = entries.filter((d) => /^iter_\d+$/.test(d) || d === "release");
  const candidates = iters.length > 0 ? iters : entries;
  if (candidates.length === 1) return findIterationDir(join(input, candidates[0] as string));
  if (iters.length > 1) {
    throw new InputError(
      `${input}: several iterations (${iters.join(", ")}) and no ${TRACKER}; pass one of them as --input`,
    );
  }
  throw new InputError(
    `${input}: not a Megatron checkpoint (no ${TRACKER}, iter_XXXXXXX or mp_rank_XX folders under ${basename(input)})`,
  );
}

function subdirs(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .map((e) => e.name)
    .sort();
}
