import { closeSync, openSync, readSync, writeSync } from "node:fs";

/**
 * Sequential binary output through a 1 MiB buffer with synchronous writes: for builders
 * that write large files from one thread, where an await per record would dominate.
 */
export class BinaryWriter {
  private readonly fd: number;
  private buf = Buffer.allocUnsafe(1 << 20);
  private used = 0;
  /** Bytes written so far (buffered included). */
  position = 0;

  constructor(readonly path: string) {
    this.fd = openSync(path, "w");
  }

  private room(n: number): void {
    if (this.used + n <= this.buf.length) return;
    this.flush();
    if (n > this.buf.length) this.buf = Buffer.allocUnsafe(n);
  }

  bytes(data: Uint8Array): void {
    if (data.length >= this.buf.length) {
      this.flush();
      writeAll(this.fd, data);
    } else {
      this.room(data.length);
      this.buf.set(data, this.used);
      this.used += data.length;
    }
    this.position += data.length;
  }

  u32(n: number): void {
    this.room(4);
    this.buf.writeUInt32LE(n, this.used);
    this.used += 4;
    this.position += 4;
  }

  f32(x: number): void {
    this.room(4);
    this.buf.writeFloatLE(x, this.used);
    this.used += 4;
    this.position += 4;
  }

  /** An unsigned integer below 2^53, as 8 bytes. */
  u64(n: number): void {
    this.room(8);
    this.buf.writeUInt32LE(n % 0x100000000, this.used);
    this.buf.writeUInt32LE(Math.floor(n / 0x100000000), this.used + 4);
    this.used += 8;
    this.position += 8;
  }

  varint(n: number): void {
    this.room(10);
    const before = this.used;
    this.used = writeVarint(this.buf, this.used, n);
    this.position += this.used - before;
  }

  flush(): void {
    if (this.used > 0) writeAll(this.fd, this.buf.subarray(0, this.used));
    this.used = 0;
  }

  close(): void {
    this.flush();
    closeSync(this.fd);
  }
}

function writeAll(fd: number, data: Uint8Array): void {
  let off = 0;
  while (off < data.length) off += writeSync(fd, data, off, data.length - off);
}

/** Sequential binary input through a buffer that grows to fit the largest record asked for. */
export class BinaryReader {
  private readonly fd: number;
  private buf = Buffer.allocUnsafe(1 << 20);
  private start = 0;
  private end = 0;
  private filePos = 0;
  private eof = false;

  constructor(readonly path: string) {
    this.fd = openSync(path, "r");
  }

  /** Makes `n` bytes available from the cursor; false at end of file. */
  private fill(n: number): boolean {
    if (this.end - this.start >= n) return true;
    if (this.eof) return false;
    if (n > this.buf.length) {
      const bigger = Buffer.allocUnsafe(Math.max(n, this.buf.length * 2));
      this.buf.copy(bigger, 0, this.start, this.end);
      this.buf = bigger;
    } else {
      this.buf.copy(this.buf, 0, this.start, this.end);
    }
    this.end -= this.start;
    this.start = 0;
    while (this.end < this.buf.length) {
      const got = readSync(this.fd, this.buf, this.end, this.buf.length - this.end, this.filePos);
      if (got === 0) {
        this.eof = true;
        break;
      }
      this.end += got;
      this.filePos += got;
    }
    return this.end - this.start >= n;
  }

  atEnd(): boolean {
    return !this.fill(1);
  }

  varint(): number {
    this.fill(10);
    const [value, next] = readVarint(this.buf, this.start);
    if (next > this.end) throw new Error(`${this.path}: truncated varint`);
    this.start = next;
    return value;
  }

  /** The next `n` bytes; valid until the next read. */
  bytes(n: number): Buffer {
    if (!this.fill(n)) throw new Error(`${this.path}: truncated (wanted ${n} bytes)`);
    const out = this.buf.subarray(this.start, this.start + n);
    this.start += n;
    return out;
  }

  close(): void {
    closeSync(this.fd);
  }
}

/** LEB128 encode of a non-negative integer below 2^53; returns the new offset. */
export function writeVarint(buf: Uint8Array, offset: number, n: number): number {
  let off = offset;
  let v = n;
  while (v >= 0x80) {
    buf[off++] = (v % 0x80) | 0x80;
    v = Math.floor(v / 0x80);
  }
  buf[off++] = v;
  return off;
}

/** LEB128 decode at `offset`: [value, offset after it]. */
export function readVarint(buf: Uint8Array, offset: number): [number, number] {
  let off = offset;
  let value = 0;
  let scale = 1;
  for (;;) {
    const b = buf[off++] as number;
    value += (b & 0x7f) * scale;
    if (b < 0x80) return [value, off];
    scale *= 0x80;
  }
}
