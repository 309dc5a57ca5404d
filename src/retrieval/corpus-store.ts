import { createHash } from "node:crypto";
import { type FileHandle, open, stat } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { deflateRawSync, inflateRaw } from "node:zlib";
import { BinaryWriter } from "../runtime/binary-file.js";
import { InputError } from "../runtime/errors.js";
import type { CorpusIdentity } from "./bm25/format.js";

/**
 * Random access to corpus rows by row number without holding the corpus in memory.
 *
 * A plain jsonl corpus is read in place: `corpus.offsets` holds the u64 byte offset of
 * each row's line, then the file size. A gzipped corpus cannot be read at an offset, so
 * its rows are copied into `corpus.blocks`: runs of BLOCK_ROWS lines ("\n"-joined), each
 * deflated on its own; `corpus.blocks.idx` holds the u64 start of each block, then the
 * end. Blank lines are not rows (as the JSON readers Search-R1 uses skip them).
 */
export const OFFSETS_FILE = "corpus.offsets";
export const BLOCKS_FILE = "corpus.blocks";
export const BLOCKS_INDEX_FILE = "corpus.blocks.idx";
const BLOCK_ROWS = 64;
const EDGE_BYTES = 1 << 20;

export type CorpusKind = CorpusIdentity["kind"];

export function corpusKind(path: string): CorpusKind {
  return path.endsWith(".gz") ? "jsonl.gz" : "jsonl";
}

/**
 * Size and hashes of the first and last MiB: tells the corpus an index was built from
 * from another file (or a truncated, appended or re-exported copy) without reading 13 GB.
 */
export async function identifyCorpus(path: string): Promise<Omit<CorpusIdentity, "rows" | "path">> {
  const info = await stat(path);
  const fh = await open(path, "r");
  try {
    const hashAt = async (position: number) => {
      const buf = Buffer.alloc(Math.min(EDGE_BYTES, info.size));
      await fh.read(buf, 0, buf.length, position);
      return createHash("sha256").update(buf).digest("hex");
    };
    return {
      kind: corpusKind(path),
      bytes: info.size,
      head_sha256: await hashAt(0),
      tail_sha256: await hashAt(Math.max(0, info.size - EDGE_BYTES)),
    };
  } finally {
    await fh.close();
  }
}

/** Writes the store while the builder streams the corpus, one row at a time, in order. */
export class CorpusStoreWriter {
  private readonly out: BinaryWriter;
  private readonly index: BinaryWriter | null;
  private block: Buffer[] = [];

  constructor(
    dir: string,
    readonly kind: CorpusKind,
  ) {
    if (kind === "jsonl") {
      this.out = new BinaryWriter(join(dir, OFFSETS_FILE));
      this.index = null;
    } else {
      this.out = new BinaryWriter(join(dir, BLOCKS_FILE));
      this.index = new BinaryWriter(join(dir, BLOCKS_INDEX_FILE));
    }
  }

  /** One row: its line's byte offset in the corpus file (plain) or its bytes (gzipped). */
  add(offset: number, line: Buffer): void {
    if (this.index === null) {
      this.out.u64(offset);
      return;
    }
    this.block.push(Buffer.from(line)); // a copy: the batch's bytes move on to a worker
    if (this.block.length === BLOCK_ROWS) this.flushBlock();
  }

  private flushBlock(): void {
    if (this.index === null || this.block.length === 0) return;
    this.index.u64(this.out.position);
    const joined = Buffer.concat(this.block.flatMap((b, i) => (i ? [NEWLINE, b] : [b])));
    this.out.bytes(deflateRawSync(joined, { level: 1 }));
    this.block = [];
  }

  /** Completes the files; `end` is the corpus file size (plain). */
  finish(end: number): void {
    if (this.index === null) {
      this.out.u64(end);
    } else {
      this.flushBlock();
      this.index.u64(this.out.position);
      this.index.close();
    }
    this.out.close();
  }
}

const NEWLINE = Buffer.from("\n");
const inflate = promisify(inflateRaw);

export interface CorpusStore {
  readonly rows: number;
  /** The JSON text of each row asked for (one object each, no newline). */
  read(rows: readonly number[]): Promise<string[]>;
  close(): Promise<void>;
}

/** Opens the store of `indexDir` over `corpusPath`, checking the file is the one indexed. */
export async function openCorpusStore(
  indexDir: string,
  corpusPath: string,
  identity: CorpusIdentity,
): Promise<CorpusStore> {
  let actual: Awaited<ReturnType<typeof identifyCorpus>>;
  try {
    actual = await identifyCorpus(corpusPath);
  } catch (err) {
    throw new InputError(`${corpusPath}: cannot read the corpus (${(err as Error).message})`);
  }
  if (
    actual.bytes !== identity.bytes ||
    actual.head_sha256 !== identity.head_sha256 ||
    actual.tail_sha256 !== identity.tail_sha256
  ) {
    throw new InputError(
      `${corpusPath} is not the corpus the index in ${indexDir} was built from ` +
        `(built from ${identity.path}: ${identity.bytes} bytes; this file: ${actual.bytes} bytes` +
        `${actual.bytes === identity.bytes ? ", different content" : ""})`,
    );
  }
  if (identity.kind === "jsonl") {
    const [offsets, corpus] = await Promise.all([
      open(join(indexDir, OFFSETS_FILE), "r"),
      open(corpusPath, "r"),
    ]);
    return new OffsetStore(offsets, corpus, identity.rows);
  }
  const [index, blocks] = await Promise.all([
    open(join(indexDir, BLOCKS_INDEX_FILE), "r"),
    open(join(indexDir, BLOCKS_FILE), "r"),
  ]);
  return new BlockStore(index, blocks, identity.rows);
}

async function readAt(fh: FileHandle, position: number, length: number): Promise<Buffer> {
  const buf = Buffer.allocUnsafe(length);
  let got = 0;
  while (got < length) {
    const { bytesRead } = await fh.read(buf, got, length - got, position + got);
    if (bytesRead === 0) break;
    got += bytesRead;
  }
  return buf.subarray(0, got);
}

function u64At(buf: Buffer, at: number): number {
  return buf.readUInt32LE(at) + buf.readUInt32LE(at + 4) * 0x100000000;
}

function checkRow(row: number, rows: number): void {
  if (!Number.isInteger(row) || row < 0 || row >= rows) {
    throw new RangeError(`row ${row} outside the corpus (0..${rows - 1})`);
  }
}

class OffsetStore implements CorpusStore {
  constructor(
    private readonly offsets: FileHandle,
    private readonly corpus: FileHandle,
    readonly rows: number,
  ) {}

  read(rows: readonly number[]): Promise<string[]> {
    return Promise.all(rows.map((row) => this.readOne(row)));
  }

  private async readOne(row: number): Promise<string> {
    checkRow(row, this.rows);
    const pair = await readAt(this.offsets, row * 8, 16);
    const start = u64At(pair, 0);
    const line = await readAt(this.corpus, start, u64At(pair, 8) - start);
    const nl = line.indexOf(10); // the next row may start after blank lines
    return line.toString("utf8", 0, nl < 0 ? line.length : nl).trimEnd();
  }

  async close(): Promise<void> {
    await Promise.all([this.offsets.close(), this.corpus.close()]);
  }
}

class BlockStore implements CorpusStore {
  /** Recently inflated blocks: requests cluster on a few documents during training. */
  private readonly cache = new Map<number, Promise<string[]>>();

  constructor(
    private readonly index: FileHandle,
    private readonly blocks: FileHandle,
    readonly rows: number,
  ) {}

  read(rows: readonly number[]): Promise<string[]> {
    return Promise.all(
      rows.map(async (row) => {
        checkRow(row, this.rows);
        const lines = await this.block(Math.floor(row / BLOCK_ROWS));
        return lines[row % BLOCK_ROWS] as string;
      }),
    );
  }

  private block(n: number): Promise<string[]> {
    let lines = this.cache.get(n);
    if (lines === undefined) {
      lines = this.load(n);
      if (this.cache.size >= 256) this.cache.delete(this.cache.keys().next().value as number);
      this.cache.set(n, lines);
      lines.catch(() => this.cache.delete(n));
    }
    return lines;
  }

  private async load(n: number): Promise<string[]> {
    const pair = await readAt(this.index, n * 8, 16);
    const start = u64At(pair, 0);
    const raw = await inflate(await readAt(this.blocks, start, u64At(pair, 8) - start));
    return raw
      .toString("utf8")
      .split("\n")
      .map((l) => l.trimEnd());
  }

  async close(): Promise<void> {
    await Promise.all([this.index.close(), this.blocks.close()]);
  }
}
