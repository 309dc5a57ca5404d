import { createReadStream } from "node:fs";
import type { Readable } from "node:stream";
import { createGunzip } from "node:zlib";
import { InputError } from "../runtime/errors.js";
import { corpusKind } from "./corpus-store.js";

/** A run of consecutive corpus rows, cut at line ends, ready to hand to a worker. */
export interface LineBatch {
  /** Row number of the first line. */
  firstRow: number;
  /** The batch's bytes, from its first row's start to its last row's end. */
  bytes: Uint8Array;
  /** Each row's [start, end) in `bytes` (end excludes "\r\n"). */
  starts: Uint32Array;
  ends: Uint32Array;
  /** Each row's byte offset in the (decompressed) corpus stream. */
  offsets: Float64Array;
  /** Each row's 1-based line number, for error messages. */
  lineNumbers: Float64Array;
}

function isBlank(buf: Buffer, start: number, end: number): boolean {
  for (let i = start; i < end; i++) {
    const c = buf[i];
    if (c !== 0x20 && c !== 0x09 && c !== 0x0d) return false;
  }
  return true;
}

/**
 * Streams a jsonl or jsonl.gz corpus as batches of about `batchBytes`, skipping blank
 * lines (they are not rows). Memory stays at a few batches whatever the corpus size.
 */
export async function* corpusBatches(
  path: string,
  batchBytes: number,
  signal?: AbortSignal,
): AsyncGenerator<LineBatch> {
  const file = createReadStream(path, { highWaterMark: 1 << 20, signal });
  const stream: Readable =
    corpusKind(path) === "jsonl.gz"
      ? file.pipe(createGunzip({ chunkSize: 1 << 20 })).on("close", () => file.destroy())
      : file;
  if (stream !== file) file.on("error", (err) => stream.destroy(err));

  let row = 0;
  let line = 0;
  let consumed = 0; // stream offset of `pending`'s first byte
  let pending: Buffer = Buffer.alloc(0);
  let parts: Buffer[] = [];
  let partBytes = 0;

  function* cut(data: Buffer, final: boolean): Generator<LineBatch> {
    const starts: number[] = [];
    const ends: number[] = [];
    const lines: number[] = [];
    let pos = 0;
    while (pos < data.length) {
      let nl = data.indexOf(10, pos);
      if (nl < 0) {
        if (!final) break;
        nl = data.length;
      }
      line++;
      let end = nl;
      if (end > pos && data[end - 1] === 0x0d) end--;
      if (!isBlank(data, pos, end)) {
        starts.push(pos);
        ends.push(end);
        lines.push(line);
      }
      pos = nl + 1;
    }
    if (starts.length > 0) {
      const base = starts[0] as number;
      const last = ends[ends.length - 1] as number;
      yield {
        firstRow: row,
        bytes: new Uint8Array(data.subarray(base, last)),
        starts: Uint32Array.from(starts, (s) => s - base),
        ends: Uint32Array.from(ends, (e) => e - base),
        offsets: Float64Array.from(starts, (s) => consumed + s),
        lineNumbers: Float64Array.from(lines),
      };
      row += starts.length;
    }
    const rest = Math.min(pos, data.length);
    consumed += rest;
    pending = Buffer.from(data.subarray(rest));
  }

  try {
    for await (const chunk of stream) {
      parts.push(chunk as Buffer);
      partBytes += (chunk as Buffer).length;
      if (partBytes < batchBytes) continue;
      const data = Buffer.concat([pending, ...parts]);
      parts = [];
      partBytes = 0;
      yield* cut(data, false);
    }
  } catch (err) {
    if (signal?.aborted) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new InputError(`${path}: no such corpus file`);
    if (code === "Z_DATA_ERROR" || code === "Z_BUF_ERROR") {
      throw new InputError(`${path}: not a valid gzip file (${(err as Error).message})`);
    }
    throw new InputError(`${path}: cannot read the corpus (${(err as Error).message})`);
  }
  yield* cut(Buffer.concat([pending, ...parts]), true);
}

/**
 * The `contents` of one corpus row (a line's JSON text), or an Error naming the file and
 * line when the row is not an object with a string `contents`.
 */
export function corpusContents(line: string, path: string, lineNumber: number): string {
  let doc: unknown;
  try {
    doc = JSON.parse(line);
  } catch {
    throw new Error(`${path}:${lineNumber}: not valid JSON`);
  }
  const contents = (doc as { contents?: unknown } | null)?.contents;
  if (typeof contents !== "string") {
    throw new Error(`${path}:${lineNumber}: expected an object with a string "contents" field`);
  }
  return contents;
}
