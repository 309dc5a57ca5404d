/**
 * Writes a Hugging Face model folder as transformers' save_pretrained lays it out: the base
 * model's config, tokenizer and other non-weight files, and the converted tensors as
 * safetensors shards, with `model.safetensors.index.json` when there is more than one.
 */
import { copyFile, mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { InputError, UsageError } from "../runtime/errors.js";
import type { Progress } from "../runtime/progress.js";
import { refuseExisting, replaceDir } from "../runtime/replace-dir.js";
import {
  type DType,
  shapeStr,
  type TensorEntry,
  tensorBytes,
  writeSafetensorsStreamed,
} from "../tensors/safetensors.js";
import { castBytes, isFloat, outputDType } from "./cast.js";
import { readConfig } from "./model-dims.js";
import type { OutputDType, SourceTensor } from "./source.js";

/** Weights of any format: the base model's are replaced by the converted ones. */
const WEIGHT_FILE = /\.(safetensors|bin|pt|pth|h5|msgpack|ckpt)$|\.(safetensors|bin)\.index\.json$/;
const INDEX_FILE = "model.safetensors.index.json";
/** transformers refuses to load safetensors weights without it. */
const METADATA = { format: "pt" };

const SIZE_UNITS = new Map([
  ["", 1],
  ["kb", 1e3],
  ["mb", 1e6],
  ["gb", 1e9],
  ["kib", 2 ** 10],
  ["mib", 2 ** 20],
  ["gib", 2 ** 30],
]);

/** config.json's dtype names, with the `--dtype` that writes them. */
const CONFIG_DTYPES = new Map<unknown, { dtype: DType; option: OutputDType }>([
  ["bfloat16", { dtype: "BF16", option: "bf16" }],
  ["float16", { dtype: "F16", option: "fp16" }],
  ["float32", { dtype: "F32", option: "fp32" }],
]);

/**
 * A shard size as transformers reads `max_shard_size`: "5GB" = 5·10^9 bytes, "5GiB" =
 * 5·2^30, likewise KB/MB/KiB/MiB, a plain integer is bytes. Units are case-insensitive
 * here (transformers reads a lowercase "b" as bits).
 */
export function parseShardSize(text: string, option = "--max-shard-size"): number {
  const match = /^\s*(\d+)\s*([a-z]*)\s*$/i.exec(text);
  const unit = SIZE_UNITS.get(match?.[2]?.toLowerCase() ?? "?");
  if (!match || unit === undefined) {
    throw new UsageError(
      `${option}: expected a size such as 5GB, 500MB, 2GiB or a number of bytes; got ${JSON.stringify(text)}`,
    );
  }
  const bytes = Number(match[1]) * unit;
  if (bytes <= 0 || !Number.isSafeInteger(bytes)) {
    throw new UsageError(
      `${option}: ${JSON.stringify(text)} is not a usable size (1 byte to 8 PiB)`,
    );
  }
  return bytes;
}

export interface Shard<T extends TensorEntry> {
  file: string;
  tensors: T[];
}

/**
 * Splits tensors into shards by huggingface_hub's split_state_dict_into_shards (what
 * save_pretrained uses): in order, a shard is closed when the next tensor would take it
 * past `maxBytes`; a tensor larger than `maxBytes` gets a shard of its own, numbered where
 * it is met, while the open shard stays open for the tensors after it.
 */
export function planShards<T extends TensorEntry>(
  tensors: readonly T[],
  maxBytes: number,
): Shard<T>[] {
  const groups: T[][] = [];
  let current: T[] = [];
  let size = 0;
  for (const t of tensors) {
    const bytes = tensorBytes(t);
    if (bytes > maxBytes) {
      groups.push([t]);
      continue;
    }
    if (size + bytes > maxBytes) {
      groups.push(current);
      current = [];
      size = 0;
    }
    current.push(t);
    size += bytes;
  }
  if (current.length > 0) groups.push(current);
  const n = String(groups.length).padStart(5, "0");
  return groups.map((group, i) => ({
    file:
      groups.length === 1
        ? "model.safetensors"
        : `model-${String(i + 1).padStart(5, "0")}-of-${n}.safetensors`,
    tensors: group,
  }));
}

export interface HfFolderOptions {
  out: string;
  /** The base model folder: config.json, tokenizer and generation files come from here. */
  baseDir: string;
  tensors: SourceTensor[];
  dtype: OutputDType;
  maxShardBytes: number;
  overwrite: boolean;
  /**
   * Copy config.json unchanged even when its (torch_)dtype names another dtype than the
   * tensors are written in (a warning says so); by default that field is set to match.
   */
  keepConfig?: boolean;
  progress: Progress;
  signal?: AbortSignal;
  warn: (msg: string) => void;
  /** Writes more files into the new folder (given) before it is put in place. */
  extra?: (dir: string) => Promise<void>;
}

export interface HfFolderSummary {
  /** Shard file names, in order. */
  files: string[];
  tensors: number;
  /** Tensor data bytes written (the index's total_size). */
  bytes: number;
  /** The dtypes written, sorted. */
  dtypes: DType[];
  /** config.json's dtype fields that were set to match the tensors (none when unchanged). */
  configDtype: ConfigDtypeChange[];
}

export interface ConfigDtypeChange {
  /** `torch_dtype` (transformers 4) or `dtype` (transformers 5). */
  field: string;
  from: unknown;
  to: string;
}

interface OutputTensor extends TensorEntry {
  source: SourceTensor;
}

/**
 * Writes everything into `<out>.partial-<pid>` and renames it to `out` only when complete;
 * an existing `out` (only replaced with `overwrite`) is removed only after that. On any
 * failure or abort the partial folder is removed and `out` is as it was.
 */
export async function writeHfFolder(opts: HfFolderOptions): Promise<HfFolderSummary> {
  const { out, baseDir } = opts;
  await refuseExisting(out, opts.overwrite);
  const extras = await nonWeightFiles(baseDir);
  const config = readConfig(join(baseDir, "config.json"));
  const entries = outputEntries(opts.tensors, opts.dtype);
  const shards = planShards(entries, opts.maxShardBytes);
  const bytes = entries.reduce((sum, t) => sum + tensorBytes(t), 0);

  const dtypes = [...new Set(entries.map((t) => t.dtype))].sort();
  const changes = opts.keepConfig ? [] : configDtypeChanges(config, dtypes);

  const tmp = `${out}.partial-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  try {
    await fsOp(`${tmp}: cannot create`, mkdir(tmp, { recursive: true }));
    for (const name of extras) {
      const from = join(baseDir, name);
      await fsOp(`${from}: cannot copy to ${tmp}`, copyFile(from, join(tmp, name)));
    }
    if (changes.length > 0) await setConfigDtype(join(tmp, "config.json"), changes);
    await writeShards(tmp, shards, bytes, opts);
    if (shards.length > 1) {
      const index = join(tmp, INDEX_FILE);
      await fsOp(`${index}: cannot write`, writeFile(index, indexJson(shards, bytes)));
    }
    await opts.extra?.(tmp);
    opts.signal?.throwIfAborted();
    await fsOp(`${out}: cannot put the new folder in place`, replaceDir(tmp, out));
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }

  if (changes.length === 0) {
    const mismatch = dtypeMismatch(config, join(out, "config.json"), dtypes);
    if (mismatch) opts.warn(mismatch);
  }
  return {
    files: shards.map((s) => s.file),
    tensors: entries.length,
    bytes,
    dtypes,
    configDtype: changes,
  };
}

/** The regular files of `baseDir` (links followed) that are not weights; config.json is required. */
async function nonWeightFiles(baseDir: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(baseDir);
  } catch (e) {
    throw new InputError(`${baseDir}: cannot read the base model folder (${errnoCode(e)})`);
  }
  if (!names.includes("config.json")) {
    throw new InputError(`${join(baseDir, "config.json")}: no such file (the base model's config)`);
  }
  const files: string[] = [];
  for (const name of names.sort()) {
    if (WEIGHT_FILE.test(name)) continue;
    const info = await stat(join(baseDir, name)).catch(() => undefined); // a dangling link
    if (info?.isFile()) files.push(name);
  }
  return files;
}

function outputEntries(tensors: readonly SourceTensor[], dtype: OutputDType): OutputTensor[] {
  if (tensors.length === 0) throw new InputError("nothing to write: the checkpoint has no tensors");
  const seen = new Set<string>();
  return tensors.map((source) => {
    if (seen.has(source.name)) {
      throw new InputError(`tensor '${source.name}' appears more than once in the checkpoint`);
    }
    seen.add(source.name);
    const { name, shape } = source;
    return { name, dtype: outputDType(source.dtype, dtype), shape, source };
  });
}

/** One tensor in memory at a time: read, checked, cast, written. */
async function writeShards(
  dir: string,
  shards: readonly Shard<OutputTensor>[],
  total: number,
  opts: HfFolderOptions,
): Promise<void> {
  const task = opts.progress.task(`writing ${opts.out}`, total, "B");
  let done = 0;
  try {
    for (const shard of shards) {
      const next = async (i: number) => {
        opts.signal?.throwIfAborted();
        const t = shard.tensors[i] as OutputTensor;
        const bytes = castBytes(await readChecked(t.source), t.source.dtype, t.dtype);
        done += bytes.length;
        task.update(done);
        return bytes;
      };
      await writeSafetensorsStreamed(join(dir, shard.file), shard.tensors, next, METADATA);
    }
  } finally {
    task.finish();
  }
}

async function readChecked(t: SourceTensor): Promise<Buffer> {
  const bytes = await t.read();
  const want = tensorBytes(t);
  if (bytes.length !== want) {
    throw new InputError(
      `tensor '${t.name}': read ${bytes.length} bytes, but ${t.dtype} ${shapeStr(t.shape)} takes ${want}`,
    );
  }
  return bytes;
}

/** Byte for byte as transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n". */
function indexJson(shards: readonly Shard<TensorEntry>[], totalSize: number): string {
  const map = shards.flatMap((s) => s.tensors.map((t) => [t.name, s.file] as const));
  map.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const lines = map.map(([name, file]) => `    ${pyJson(name)}: ${pyJson(file)}`);
  return `{\n  "metadata": {\n    "total_size": ${totalSize}\n  },\n  "weight_map": {\n${lines.join(",\n")}\n  }\n}\n`;
}

/** A JSON string as Python's json.dumps writes it: non-ASCII escaped as \uXXXX. */
function pyJson(s: string): string {
  return JSON.stringify(s).replace(
    /[\u0080-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** config.json's fields naming the dtype: transformers 5 writes `dtype`, 4 `torch_dtype`. */
const DTYPE_FIELDS = ["torch_dtype", "dtype"] as const;

/** The config.json name of a dtype (bfloat16, float16, float32). */
function configName(dtype: DType): string | undefined {
  for (const [name, d] of CONFIG_DTYPES) if (d.dtype === dtype) return name as string;
  return undefined;
}

/**
 * The dtype fields of config.json to set so that transformers loads the weights in the
 * dtype they are written in: each field the base config has that names another dtype, when
 * every floating-point tensor is written in one dtype (a mix has no single right value).
 */
function configDtypeChanges(
  config: Record<string, unknown>,
  dtypes: readonly DType[],
): ConfigDtypeChange[] {
  const floats = dtypes.filter(isFloat);
  const to = floats.length === 1 ? configName(floats[0] as DType) : undefined;
  if (!to) return [];
  return DTYPE_FIELDS.filter(
    (field) => typeof config[field] === "string" && config[field] !== to,
  ).map((field) => ({ field, from: config[field], to }));
}

/**
 * Sets the fields in config.json's text, so that every other byte stays as the base model
 * wrote it; falls back to re-serialising when a field's value is not found exactly once.
 */
async function setConfigDtype(path: string, changes: readonly ConfigDtypeChange[]): Promise<void> {
  const text = await fsOp(`${path}: cannot read`, readFile(path, "utf8"));
  let edited = text;
  for (const { field, from, to } of changes) {
    const value = JSON.stringify(from).replace(/[.*+?^$()|[\]{}\\]/g, "\\$&");
    const pattern = new RegExp(`("${field}"\\s*:\\s*)${value}`, "g");
    const hits = edited.match(pattern)?.length ?? 0;
    edited = hits === 1 ? edited.replace(pattern, `$1${JSON.stringify(to)}`) : "";
    if (!edited) break;
  }
  const parsed = edited ? (JSON.parse(edited) as Record<string, unknown>) : undefined;
  if (!parsed || changes.some((c) => parsed[c.field] !== c.to)) {
    const config = JSON.parse(text) as Record<string, unknown>;
    for (const c of changes) config[c.field] = c.to;
    edited = `${JSON.stringify(config, null, 2)}\n`;
  }
  await fsOp(`${path}: cannot write`, writeFile(path, edited));
}

/** The warning when config.json's (torch_)dtype is not the dtype the float tensors were written in. */
function dtypeMismatch(
  config: Record<string, unknown>,
  configPath: string,
  dtypes: readonly DType[],
): string | undefined {
  const field = config.dtype !== undefined ? "dtype" : "torch_dtype";
  const said = CONFIG_DTYPES.get(config[field]);
  const floats = dtypes.filter(isFloat);
  if (!said || floats.every((d) => d === said.dtype)) return undefined;
  const fix =
    floats.length === 1
      ? `transformers will load them as ${config[field]} (--keep-config); without --keep-config it is set to match`
      : `pass --dtype ${said.option} to write them all as ${config[field]}`;
  return `${configPath}: tensors are ${floats.join(", ")} but config.json says ${field} ${config[field]}; ${fix}`;
}

/** Awaits a file operation, reporting its failure as an InputError: `what (ERRNO)`. */
async function fsOp<T>(what: string, op: Promise<T>): Promise<T> {
  try {
    return await op;
  } catch (e) {
    throw new InputError(`${what} (${errnoCode(e)})`);
  }
}

function errnoCode(e: unknown): string {
  return (e as NodeJS.ErrnoException).code ?? (e as Error).message;
}
