/**
 * Read-only access to the zip container that `torch.save` writes: entries are stored
 * (not compressed), so an entry's bytes are read straight from the file at an offset and
 * a multi-GB checkpoint is never loaded whole. Zip64 (files or entries over 4 GiB) is
 * handled; anything else that torch never writes (compression, encryption, multi-disk
 * archives) is refused with the entry's name.
 */
import { type FileHandle, open } from "node:fs/promises";
import { InputError } from "../runtime/errors.js";

export interface ZipEntry {
  name: string;
  /** Absolute file offset of the entry's first data byte. */
  dataOffset: number;
  size: number;
}

const EOCD = 0x06054b50;
const ZIP64_LOCATOR = 0x07064b50;
const ZIP64_EOCD = 0x06064b50;
const CENTRAL = 0x02014b50;
const LOCAL = 0x04034b50;
const U16_MAX = 0xffff;
const U32_MAX = 0xffffffff;

export class ZipArchive {
  private constructor(
    readonly path: string,
    private readonly handle: FileHandle,
    readonly fileSize: number,
    readonly entries: ReadonlyMap<string, ZipEntry>,
  ) {}

  static async open(path: string): Promise<ZipArchive> {
    let handle: FileHandle;
    try {
      handle = await open(path, "r");
    } catch (e) {
      throw new InputError(`${path}: cannot open (${(e as NodeJS.ErrnoException).code ?? e})`);
    }
    try {
      const { size } = await handle.stat();
      const entries = await readDirectory(path, handle, size);
      return new ZipArchive(path, handle, size, entries);
    } catch (e) {
      await handle.close();
      throw e;
    }
  }

  /** Bytes [start, start + length) of an entry's data. */
  async read(entry: ZipEntry, start = 0, length = entry.size - start): Promise<Buffer> {
    if (start < 0 || length < 0 || start + length > entry.size) {
      throw new InputError(
        `${this.path}: read of ${length} bytes at ${start} is outside entry ${entry.name} (${entry.size} bytes)`,
      );
    }
    return readExactly(this.path, this.handle, entry.dataOffset + start, length);
  }

  async close(): Promise<void> {
    await this.handle.close();
  }
}

async function readExactly(
  path: string,
  handle: FileHandle,
  position: number,
  length: number,
): Promise<Buffer> {
  const out = Buffer.allocUnsafe(length);
  let done = 0;
  while (done < length) {
    const { bytesRead } = await handle.read(out, done, length - done, position + done);
    if (bytesRead === 0)
      throw new InputError(`${path}: truncated (wanted bytes up to ${position + length})`);
    done += bytesRead;
  }
  return out;
}

/** Central directory → entries, each checked against its local header and the file size. */
async function readDirectory(
  path: string,
  handle: FileHandle,
  size: number,
): Promise<Map<string, ZipEntry>> {
  const bad = (why: string) => new InputError(`${path}: not a torch.save zip checkpoint (${why})`);
  if (size < 22) throw bad("file too short for a zip directory");
  const tailLength = Math.min(size, 22 + U16_MAX);
  const tail = await readExactly(path, handle, size - tailLength, tailLength);
  let at = -1;
  for (let i = tail.length - 22; i >= 0; i--) {
    if (tail.readUInt32LE(i) === EOCD) {
      at = i;
      break;
    }
  }
  if (at < 0) {
    const head = await readExactly(path, handle, 0, Math.min(size, 4));
    const legacy = head[0] === 0x80 ? "; the pre-1.6 legacy torch format is not supported" : "";
    throw bad(`no end-of-directory record: truncated, or not a zip${legacy}`);
  }
  let count = tail.readUInt16LE(at + 10);
  let dirSize = tail.readUInt32LE(at + 12);
  let dirOffset = tail.readUInt32LE(at + 16);
  if (tail.readUInt16LE(at + 4) !== 0 || tail.readUInt16LE(at + 6) !== 0) {
    throw bad("multi-disk archive");
  }
  if (count === U16_MAX || dirSize === U32_MAX || dirOffset === U32_MAX) {
    const locAt = size - tailLength + at - 20;
    if (locAt < 0) throw bad("zip64 locator missing");
    const loc = await readExactly(path, handle, locAt, 20);
    if (loc.readUInt32LE(0) !== ZIP64_LOCATOR) throw bad("zip64 locator missing");
    const z64At = toNumber(loc.readBigUInt64LE(8), bad);
    if (z64At + 56 > size) throw bad("zip64 directory record outside the file");
    const z64 = await readExactly(path, handle, z64At, 56);
    if (z64.readUInt32LE(0) !== ZIP64_EOCD) throw bad("zip64 directory record missing");
    count = toNumber(z64.readBigUInt64LE(32), bad);
    dirSize = toNumber(z64.readBigUInt64LE(40), bad);
    dirOffset = toNumber(z64.readBigUInt64LE(48), bad);
  }
  if (dirOffset + dirSize > size) throw bad("central directory outside the file (truncated?)");
  const dir = await readExactly(path, handle, dirOffset, dirSize);
  const entries = new Map<string, ZipEntry>();
  let p = 0;
  for (let i = 0; i < count; i++) {
    if (p + 46 > dir.length || dir.readUInt32LE(p) !== CENTRAL)
      throw bad("corrupt central directory");
    const flags = dir.readUInt16LE(p + 8);
    const method = dir.readUInt16LE(p + 10);
    let compressed = dir.readUInt32LE(p + 20);
    let uncompressed = dir.readUInt32LE(p + 24);
    const nameLength = dir.readUInt16LE(p + 28);
    const extraLength = dir.readUInt16LE(p + 30);
    const commentLength = dir.readUInt16LE(p + 32);
    let localOffset = dir.readUInt32LE(p + 42);
    const end = p + 46 + nameLength + extraLength + commentLength;
    if (end > dir.length) throw bad("corrupt central directory");
    const name = dir.toString("utf8", p + 46, p + 46 + nameLength);
    // Zip64 extra field: the 64-bit values of exactly the fields that read as all ones.
    let x = p + 46 + nameLength;
    const extraEnd = x + extraLength;
    while (x + 4 <= extraEnd) {
      const id = dir.readUInt16LE(x);
      const len = dir.readUInt16LE(x + 2);
      if (id === 0x0001) {
        let q = x + 4;
        const next = () => {
          if (q + 8 > x + 4 + len) throw bad(`entry ${name}: short zip64 field`);
          const v = toNumber(dir.readBigUInt64LE(q), bad);
          q += 8;
          return v;
        };
        if (uncompressed === U32_MAX) uncompressed = next();
        if (compressed === U32_MAX) compressed = next();
        if (localOffset === U32_MAX) localOffset = next();
      }
      x += 4 + len;
    }
    if (flags & 1) throw bad(`entry ${name} is encrypted`);
    if (method !== 0 || compressed !== uncompressed) {
      throw bad(`entry ${name} is compressed (method ${method}); torch.save stores entries`);
    }
    if (localOffset + 30 > size) throw bad(`entry ${name}: local header outside the file`);
    const local = await readExactly(path, handle, localOffset, 30);
    if (local.readUInt32LE(0) !== LOCAL) throw bad(`entry ${name}: bad local header`);
    const dataOffset = localOffset + 30 + local.readUInt16LE(26) + local.readUInt16LE(28);
    if (dataOffset + uncompressed > size) {
      throw new InputError(`${path}: truncated: entry ${name} ends past the end of the file`);
    }
    entries.set(name, { name, dataOffset, size: uncompressed });
    p = end;
  }
  return entries;
}

function toNumber(v: bigint, bad: (why: string) => Error): number {
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw bad("offset too large");
  return Number(v);
}
