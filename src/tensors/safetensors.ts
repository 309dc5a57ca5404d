/**
 * safetensors files for Node: validated reading (same checks and messages as the native
 * reader in native/src/io/safetensors.cpp), atomic writing, and the bit-exact half-precision
 * conversions. Format: u64 LE header length N, N bytes of JSON (space-padded to a multiple
 * of 8), then little-endian row-major data; data_offsets are relative to the data start.
 * Typed arrays are used in host byte order, which is little-endian on every Node platform
 * this runs on.
 */
import { type FileHandle, open, rename, rm } from "node:fs/promises";
import { InputError } from "../runtime/errors.js";

export type DType =
  | "BOOL"
  | "U8"
  | "I8"
  | "I16"
  | "U16"
  | "F16"
  | "BF16"
  | "I32"
  | "U32"
  | "F32"
  | "F64"
  | "I64"
  | "U64";

/** Bytes per element. */
export const DTYPE_SIZE: Readonly<Record<DType, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  F64: 8,
  I64: 8,
  U64: 8,
};

export type TensorData =
  | Float32Array
  | Float64Array
  | BigInt64Array
  | BigUint64Array
  | Int32Array
  | Uint32Array
  | Int16Array
  | Uint16Array
  | Int8Array
  | Uint8Array;

/** A tensor in memory. F16 and BF16 hold their raw bits in a Uint16Array; BOOL is a Uint8Array. */
export interface Tensor {
  dtype: DType;
  shape: number[];
  data: TensorData;
}

export interface NamedTensor extends Tensor {
  name: string;
}

/** One header entry; `begin`/`end` are byte offsets relative to `dataStart`, as in the file. */
export interface TensorInfo {
  name: string;
  dtype: DType;
  shape: number[];
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  /** In header (document) order. */
  tensors: TensorInfo[];
  metadata: Record<string, string>;
  /** Absolute file offset of the data buffer: 8 + header length. */
  dataStart: number;
}

const MAX_HEADER_BYTES = 100_000_000;
/** Largest single read or write; Node rejects lengths of 2 GiB and more. */
const IO_CHUNK = 1 << 30;

const ARRAY_TYPE: Readonly<Record<DType, new (buffer: ArrayBuffer) => TensorData>> = {
  BOOL: Uint8Array,
  U8: Uint8Array,
  I8: Int8Array,
  I16: Int16Array,
  U16: Uint16Array,
  F16: Uint16Array,
  BF16: Uint16Array,
  I32: Int32Array,
  U32: Uint32Array,
  F32: Float32Array,
  F64: Float64Array,
  I64: BigInt64Array,
  U64: BigUint64Array,
};

function isDType(name: string): name is DType {
  return Object.hasOwn(DTYPE_SIZE, name);
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** "[2, 3]": shapes as error messages show them. */
export function shapeStr(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

function errorCode(e: unknown): string {
  return (e as NodeJS.ErrnoException).code ?? (e as Error).message;
}

// --- reading -----------------------------------------------------------------------------

/** Reads and validates the header only: dtypes, shapes, offsets tiling the data exactly. */
export async function readSafetensorsHeader(path: string): Promise<SafetensorsHeader> {
  const handle = await openForReading(path);
  try {
    return await readHeader(handle, path);
  } finally {
    await handle.close();
  }
}

/** Reads every tensor into its own (aligned) typed array, keyed by name in header order. */
export async function readSafetensors(path: string): Promise<Map<string, Tensor>> {
  const handle = await openForReading(path);
  try {
    const header = await readHeader(handle, path);
    const out = new Map<string, Tensor>();
    for (const t of header.tensors) {
      const bytes = new Uint8Array(t.end - t.begin);
      await readExactly(handle, bytes, header.dataStart + t.begin, path);
      out.set(t.name, {
        dtype: t.dtype,
        shape: t.shape,
        data: new ARRAY_TYPE[t.dtype](bytes.buffer),
      });
    }
    return out;
  } finally {
    await handle.close();
  }
}

async function openForReading(path: string): Promise<FileHandle> {
  try {
    return await open(path, "r");
  } catch (e) {
    const code = errorCode(e);
    throw new InputError(
      code === "ENOENT" ? `${path}: no such file` : `${path}: cannot read (${code})`,
    );
  }
}

async function readExactly(
  handle: FileHandle,
  into: Uint8Array,
  position: number,
  path: string,
): Promise<void> {
  let done = 0;
  while (done < into.length) {
    const want = Math.min(into.length - done, IO_CHUNK);
    const { bytesRead } = await handle.read(into, done, want, position + done);
    if (bytesRead === 0) throw new InputError(`${path}: file shrank while being read`);
    done += bytesRead;
  }
}

async function readHeader(handle: FileHandle, path: string): Promise<SafetensorsHeader> {
  const stat = await handle.stat();
  if (!stat.isFile()) throw new InputError(`${path}: cannot read (not a regular file)`);
  const size = stat.size;
  if (size < 8) {
    throw new InputError(`${path}: file is ${size} bytes, too short for a safetensors header`);
  }
  const lenBytes = new Uint8Array(8);
  await readExactly(handle, lenBytes, 0, path);
  const len = Buffer.from(lenBytes.buffer).readBigUInt64LE(0);
  if (len > BigInt(MAX_HEADER_BYTES)) {
    throw new InputError(
      `${path}: header length ${len} exceeds the limit of ${MAX_HEADER_BYTES} bytes`,
    );
  }
  const headerLen = Number(len);
  if (headerLen > size - 8) {
    throw new InputError(
      `${path}: header length ${headerLen} runs past the end of the ${size}-byte file`,
    );
  }
  const raw = new Uint8Array(headerLen);
  await readExactly(handle, raw, 8, path);
  const header = parseHeader(raw, path);
  checkCoverage(header.tensors, size - 8 - headerLen, path);
  return { ...header, dataStart: 8 + headerLen };
}

function parseHeader(raw: Uint8Array, path: string): Omit<SafetensorsHeader, "dataStart"> {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(raw);
  } catch {
    throw new InputError(`${path}: header is not valid UTF-8`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new InputError(`${path}: header: invalid JSON: ${(e as Error).message}`);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new InputError(`${path}: header is not a JSON object`);
  }
  const entries = json as Record<string, unknown>;
  const tensors: TensorInfo[] = [];
  let metadata: Record<string, string> = {};
  // JSON.parse drops duplicate keys and moves integer-like ones first, so the order and the
  // duplicate check come from the text itself.
  for (const name of topLevelKeys(text, path)) {
    if (name === "__metadata__") metadata = parseMetadata(entries[name], path);
    else tensors.push(parseEntry(name, entries[name], path));
  }
  return { tensors, metadata };
}

/** The keys of a (valid) top-level JSON object, in document order; throws on a repeat. */
function topLevelKeys(text: string, path: string): string[] {
  const keys: string[] = [];
  const seen = new Set<string>();
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") depth--;
    else if (c === '"') {
      const start = i;
      for (i++; text[i] !== '"'; i++) {
        if (text[i] === "\\") i++;
      }
      let next = i + 1;
      while (/[ \t\r\n]/.test(text[next] ?? "")) next++;
      if (depth !== 1 || text[next] !== ":") continue;
      const key = JSON.parse(text.slice(start, i + 1)) as string;
      if (seen.has(key)) {
        throw new InputError(`${path}: header: duplicate key ${JSON.stringify(key)}`);
      }
      seen.add(key);
      keys.push(key);
    }
  }
  return keys;
}

function parseMetadata(value: unknown, path: string): Record<string, string> {
  const where = `${path}: "__metadata__"`;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InputError(`${where} must be an object of strings`);
  }
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== "string") throw new InputError(`${where}: value of '${k}' must be a string`);
    out[k] = v;
  }
  return out;
}

function parseEntry(name: string, value: unknown, path: string): TensorInfo {
  const where = `${path}: tensor '${name}'`;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InputError(`${where}: entry must be an object`);
  }
  const entry = value as Record<string, unknown>;
  for (const key of ["dtype", "shape", "data_offsets"]) {
    if (!Object.hasOwn(entry, key)) throw new InputError(`${where}: missing "${key}"`);
  }
  const { dtype, shape, data_offsets: offsets } = entry;
  if (typeof dtype !== "string") throw new InputError(`${where}: "dtype" must be a string`);
  if (!isDType(dtype)) throw new InputError(`${where}: unknown or unsupported dtype '${dtype}'`);
  if (!Array.isArray(shape)) throw new InputError(`${where}: "shape" must be an array of integers`);
  const dims = shape.map((d) => integer(d, `${where}: shape entry`));
  if (dims.some((d) => d < 0)) {
    throw new InputError(`${where}: shape ${shapeStr(dims)} has a negative dimension`);
  }
  if (!Array.isArray(offsets) || offsets.length !== 2) {
    throw new InputError(`${where}: "data_offsets" must be [begin, end]`);
  }
  const begin = integer(offsets[0], `${where}: data_offsets begin`);
  const end = integer(offsets[1], `${where}: data_offsets end`);
  const offsText = `data_offsets [${begin}, ${end}]`;
  if (begin < 0 || end < begin) {
    throw new InputError(`${where}: ${offsText} are not an ordered range`);
  }
  const need = numel(dims) * DTYPE_SIZE[dtype];
  if (end - begin !== need) {
    throw new InputError(
      `${where}: ${offsText} hold ${end - begin} bytes but ${dtype} ${shapeStr(dims)} needs ${need}`,
    );
  }
  return { name, dtype, shape: dims, begin, end };
}

/** Safe integers only: offsets and sizes beyond 2^53 cannot be addressed from JS anyway. */
function integer(value: unknown, where: string): number {
  if (typeof value !== "number") throw new InputError(`${where} must be an integer`);
  if (!Number.isSafeInteger(value)) {
    throw new InputError(`${where} must be an integer; got ${value}`);
  }
  return value;
}

/** The tensors must tile the data buffer exactly: no overlap, no gap, nothing after the end. */
function checkCoverage(tensors: readonly TensorInfo[], dataSize: number, path: string): void {
  const sorted = [...tensors].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  let prev: TensorInfo | undefined;
  for (const t of sorted) {
    const where = `${path}: tensor '${t.name}'`;
    if (t.end > dataSize) {
      throw new InputError(
        `${where}: data_offsets end ${t.end} is past the end of the data (${dataSize} bytes)`,
      );
    }
    if (t.begin < cursor) throw new InputError(`${where}: data overlaps tensor '${prev?.name}'`);
    if (t.begin > cursor) {
      throw new InputError(
        `${where}: data starts at ${t.begin} leaving a gap after byte ${cursor}`,
      );
    }
    cursor = t.end;
    prev = t;
  }
  if (cursor !== dataSize) {
    throw new InputError(`${path}: tensors cover ${cursor} of the ${dataSize} data bytes`);
  }
}

// --- writing -----------------------------------------------------------------------------

/** A tensor as the header describes it, before its bytes exist. */
export interface TensorEntry {
  name: string;
  dtype: DType;
  shape: number[];
}

/** Bytes of a tensor's data: numel × element size. */
export function tensorBytes(t: { dtype: DType; shape: readonly number[] }): number {
  return numel(t.shape) * DTYPE_SIZE[t.dtype];
}

/**
 * Writes in-memory tensors in the order given (see writeSafetensorsStreamed). A tensor
 * whose data does not match its dtype and shape is a caller bug and throws a plain Error.
 */
export async function writeSafetensors(
  path: string,
  tensors: readonly NamedTensor[],
  metadata: Record<string, string> = {},
): Promise<void> {
  await writeSafetensorsStreamed(
    path,
    tensors,
    async (i) => dataBytes(tensors[i] as NamedTensor),
    metadata,
  );
}

/**
 * Writes a file one tensor at a time, `__metadata__` first when there is any: the header
 * comes from `entries`, then `next(i)` supplies tensor i's bytes, asked for only once
 * tensor i-1 is on disk, so a caller need hold one tensor at a time. Atomic: a temporary
 * file beside `path` is renamed into place, and removed again on any failure. I/O failures
 * are InputErrors naming `path`; errors from `next` pass through unchanged; an invalid
 * entry or bytes of the wrong length are caller bugs and throw a plain Error.
 */
export async function writeSafetensorsStreamed(
  path: string,
  entries: readonly TensorEntry[],
  next: (index: number) => Promise<Uint8Array>,
  metadata: Record<string, string> = {},
): Promise<void> {
  checkEntries(entries);
  const header = headerBytes(entries, metadata);
  const tmp = `${path}.tmp-${process.pid}`;
  let handle: FileHandle | undefined;
  try {
    handle = await io(path, open(tmp, "w"));
    let position = await io(path, writeAll(handle, header, 0));
    for (const [i, entry] of entries.entries()) {
      const bytes = await next(i);
      const want = tensorBytes(entry);
      if (bytes.byteLength !== want) {
        throw new Error(
          `${tensorLabel(entry)}: ${bytes.byteLength} bytes for ${entry.dtype} ${shapeStr(entry.shape)} (wants ${want})`,
        );
      }
      position = await io(path, writeAll(handle, bytes, position));
    }
    const closing = handle;
    handle = undefined;
    await io(path, closing.close());
    await io(path, rename(tmp, path));
  } catch (e) {
    await handle?.close().catch(() => {});
    await rm(tmp, { force: true });
    throw e;
  }
}

/** Awaits a file operation, reporting its failure as an InputError naming the file. */
async function io<T>(path: string, op: Promise<T>): Promise<T> {
  try {
    return await op;
  } catch (e) {
    throw new InputError(`${path}: cannot write (${errorCode(e)})`);
  }
}

function tensorLabel(t: TensorEntry): string {
  return `safetensors: tensor '${t.name}'`;
}

function checkEntries(entries: readonly TensorEntry[]): void {
  const seen = new Set<string>();
  for (const t of entries) {
    if (t.name === "__metadata__") throw new Error(`${tensorLabel(t)}: the name is reserved`);
    if (seen.has(t.name)) throw new Error(`${tensorLabel(t)}: the name is repeated`);
    seen.add(t.name);
    if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new Error(`${tensorLabel(t)}: shape ${shapeStr(t.shape)} is not a list of sizes`);
    }
  }
}

/** The tensor's data as bytes, once it is known to match its dtype and shape. */
function dataBytes(t: NamedTensor): Uint8Array {
  const Type = ARRAY_TYPE[t.dtype];
  if (!(t.data instanceof Type))
    throw new Error(`${tensorLabel(t)}: ${t.dtype} data must be a ${Type.name}`);
  if (t.data.length !== numel(t.shape)) {
    throw new Error(
      `${tensorLabel(t)}: ${t.data.length} values for ${t.dtype} ${shapeStr(t.shape)} (wants ${numel(t.shape)})`,
    );
  }
  return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** Length prefix plus the JSON header, padded with spaces to a multiple of 8. */
function headerBytes(entries: readonly TensorEntry[], metadata: Record<string, string>): Buffer {
  // Built by hand: JSON.stringify would move integer-like keys ("0") to the front.
  const members: string[] = [];
  if (Object.keys(metadata).length > 0) {
    members.push(`"__metadata__":${objectJson(Object.entries(metadata))}`);
  }
  let offset = 0;
  for (const t of entries) {
    const end = offset + tensorBytes(t);
    const entry = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, end] };
    members.push(`${JSON.stringify(t.name)}:${JSON.stringify(entry)}`);
    offset = end;
  }
  let json = Buffer.from(`{${members.join(",")}}`);
  json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, " ")]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json]);
}

function objectJson(entries: [string, string][]): string {
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`).join(",")}}`;
}

async function writeAll(handle: FileHandle, bytes: Uint8Array, position: number): Promise<number> {
  let done = 0;
  while (done < bytes.length) {
    const want = Math.min(bytes.length - done, IO_CHUNK);
    const { bytesWritten } = await handle.write(bytes, done, want, position + done);
    done += bytesWritten;
  }
  return position + done;
}

// --- conversions -------------------------------------------------------------------------

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function floatBits(x: number): number {
  f32[0] = x;
  return u32[0] as number;
}

function bitsFloat(bits: number): number {
  u32[0] = bits;
  return f32[0] as number;
}

/** Rounds `value >>> shift` to nearest, ties to even (1 <= shift <= 24, value + 2^(shift-1) < 2^32). */
function shiftRne(value: number, shift: number): number {
  // Adding half a unit less one, plus the kept part's low bit, carries into the kept part
  // exactly when the dropped bits exceed half, or equal it with the kept part odd.
  // Integer-only, so the per-value loops in cast.ts stay fast.
  return (value + (1 << (shift - 1)) - 1 + ((value >>> shift) & 1)) >>> shift;
}

export function bf16ToF32(bits: number): number {
  return bitsFloat((bits & 0xffff) << 16);
}

/**
 * `x` is first rounded to float32, then to bfloat16 bits, nearest-even; overflow gives inf.
 * NaN keeps its sign and top payload bits with the quiet bit set (as x86 AVX512-BF16 does).
 */
export function f32ToBf16(x: number): number {
  return f32BitsToBf16(floatBits(x));
}

/** f32ToBf16 on the bits of a float32, for loops over a Uint32Array view. */
export function f32BitsToBf16(b: number): number {
  if ((b & 0x7fffffff) > 0x7f800000) return (b >>> 16) | 0x0040;
  return shiftRne(b, 16);
}

/** The float32 bits of an IEEE half, exactly (every half is a float32). */
export function f16BitsToF32Bits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  let mant = h & 0x3ff;
  if (exp === 0x1f) return (sign | 0x7f800000 | (mant << 13)) >>> 0; // inf, NaN
  if (exp !== 0) return (sign | ((exp + 112) << 23) | (mant << 13)) >>> 0;
  if (mant === 0) return sign >>> 0;
  // Subnormal: mant * 2^-24, renormalised.
  let e = 113;
  while ((mant & 0x400) === 0) {
    mant <<= 1;
    e--;
  }
  return (sign | (e << 23) | ((mant & 0x3ff) << 13)) >>> 0;
}

export function f16ToF32(bits: number): number {
  return bitsFloat(f16BitsToF32Bits(bits & 0xffff));
}

/**
 * `x` is first rounded to float32, then to IEEE half bits, nearest-even, subnormals
 * included; overflow gives inf; NaN is made quiet, keeping sign and top payload bits
 * (as x86 F16C does).
 */
export function f32ToF16(x: number): number {
  return f32BitsToF16(floatBits(x));
}

/** f32ToF16 on the bits of a float32, for loops over a Uint32Array view. */
export function f32BitsToF16(b: number): number {
  const sign = (b >>> 16) & 0x8000;
  const a = b & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00 | ((a >>> 13) & 0x3ff);
  if (a >= 0x477ff000) return sign | 0x7c00; // >= 65520 rounds past 65504
  // Normal in f16: re-bias the exponent in place; a rounding carry bumps the exponent.
  if (a >= 0x38800000) return sign | shiftRne(a - (112 << 23), 13);
  if (a <= 0x33000000) return sign; // <= 2^-25 rounds to zero (2^-25 is a tie, to even)
  // Subnormal: the value in units of 2^-24 is mant * 2^(exp - 126).
  return sign | shiftRne((a & 0x7fffff) | 0x800000, 126 - (a >>> 23));
}

/**
 * The tensor as float32: F16/BF16 decoded, F64 and integers rounded, BOOL as 0/1.
 * F32 data is returned as is, not copied.
 */
export function toFloat32(t: Tensor): Float32Array {
  const { data } = t;
  if (t.dtype === "F32") return data as Float32Array;
  const out = new Float32Array(data.length);
  if (t.dtype === "BF16" || t.dtype === "F16") {
    const bits = new Uint32Array(out.buffer);
    const decode = t.dtype === "BF16" ? (h: number) => h << 16 : f16BitsToF32Bits;
    for (let i = 0; i < data.length; i++) bits[i] = decode(data[i] as number);
  } else if (t.dtype === "BOOL") {
    for (let i = 0; i < data.length; i++) out[i] = data[i] === 0 ? 0 : 1;
  } else {
    for (let i = 0; i < data.length; i++) out[i] = Number(data[i]);
  }
  return out;
}
