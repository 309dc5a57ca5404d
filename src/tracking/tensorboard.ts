/**
 * TensorBoard event files, written by hand: a file is a sequence of TFRecords (a uint64
 * length, its masked CRC-32C, the bytes, their masked CRC-32C; little-endian), each an
 * `Event` protobuf (tensorflow/core/util/event.proto): first one with `file_version`
 * "brain.Event:2", then one per step whose `Summary` holds a `simple_value` per metric (the
 * form tf.summary.scalar and PyTorch's SummaryWriter.add_scalar read back as scalars). The
 * protobuf fields used are few, so they are encoded here rather than through a protobuf
 * library; test/tracking/tensorboard.test.ts checks the bytes against files the real
 * `tensorboard` package read back (test/tracking/fixtures/tensorboard/).
 *
 * Each process opens a new file whose first event after the version is a SessionLog START
 * at the first step it logs (0 for a fresh run, N + 1 when it resumes from step N):
 * TensorBoard then drops the points of the folder's earlier files from that step on (the
 * steps an interrupted process logged after its checkpoint; a whole earlier run that
 * trainer.resume=disable started over), as it does for TensorFlow's own restarts.
 */
import { appendFileSync, mkdirSync, readdirSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";

// --- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use it.
const CRC32C_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0x82f63b78 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

export function crc32c(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const b of bytes) crc = (CRC32C_TABLE[(crc ^ b) & 0xff] as number) ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

/** TFRecord's masked CRC: rotate right by 15 bits, add 0xa282ead8 (mod 2^32). */
export function maskedCrc32c(bytes: Uint8Array): number {
  const crc = crc32c(bytes);
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** One TFRecord: length, masked CRC of the length, data, masked CRC of the data. */
export function tfRecord(data: Uint8Array): Buffer {
  const out = Buffer.alloc(8 + 4 + data.length + 4);
  out.writeBigUInt64LE(BigInt(data.length), 0);
  out.writeUInt32LE(maskedCrc32c(out.subarray(0, 8)), 8);
  out.set(data, 12);
  out.writeUInt32LE(maskedCrc32c(data), 12 + data.length);
  return out;
}

// --- Protobuf wire format: the few field kinds an Event needs.
function varint(value: number | bigint): number[] {
  let v = BigInt.asUintN(64, BigInt(value));
  const out: number[] = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

const key = (field: number, wireType: number) => varint((field << 3) | wireType);

function double(field: number, value: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(value);
  return Buffer.concat([Buffer.from(key(field, 1)), b]);
}

function float(field: number, value: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeFloatLE(value);
  return Buffer.concat([Buffer.from(key(field, 5)), b]);
}

function int(field: number, value: number): Buffer {
  return Buffer.from([...key(field, 0), ...varint(value)]);
}

function bytes(field: number, value: Uint8Array | string): Buffer {
  const data = typeof value === "string" ? Buffer.from(value, "utf8") : value;
  return Buffer.concat([Buffer.from([...key(field, 2), ...varint(data.length)]), data]);
}

// Field numbers of tensorflow/core/util/event.proto and framework/summary.proto.
const EVENT = { wallTime: 1, step: 2, fileVersion: 3, summary: 5, sessionLog: 7 } as const;
const SUMMARY_VALUE = 1;
const VALUE = { tag: 1, simpleValue: 2 } as const;
const SESSION_LOG = { status: 1 } as const;
const SESSION_START = 1;

/** The first event of every file: `file_version: "brain.Event:2"`. */
export function fileVersionEvent(wallTime: number): Buffer {
  return Buffer.concat([
    double(EVENT.wallTime, wallTime),
    bytes(EVENT.fileVersion, "brain.Event:2"),
  ]);
}

/** An event whose summary holds one `simple_value` (a float32) per tag, in the given order. */
export function scalarsEvent(
  wallTime: number,
  step: number,
  scalars: readonly (readonly [string, number])[],
): Buffer {
  const values = scalars.map(([tag, v]) =>
    bytes(SUMMARY_VALUE, Buffer.concat([bytes(VALUE.tag, tag), float(VALUE.simpleValue, v)])),
  );
  return Buffer.concat([
    double(EVENT.wallTime, wallTime),
    int(EVENT.step, step),
    bytes(EVENT.summary, Buffer.concat(values)),
  ]);
}

/** SessionLog START at `step`: TensorBoard drops earlier files' points from this step on. */
export function sessionStartEvent(wallTime: number, step: number): Buffer {
  return Buffer.concat([
    double(EVENT.wallTime, wallTime),
    int(EVENT.step, step),
    bytes(EVENT.sessionLog, int(SESSION_LOG.status, SESSION_START)),
  ]);
}

/** The finite numeric metrics of a row, in its order, `step` and `epoch` left out. */
export function rowScalars(row: Readonly<Record<string, unknown>>): [string, number][] {
  return Object.entries(row).flatMap(([k, v]) =>
    k !== "step" && k !== "epoch" && typeof v === "number" && Number.isFinite(v)
      ? [[k, v] as [string, number]]
      : [],
  );
}

export interface TensorBoardOptions {
  /** Seconds since the epoch (default: now): the events' wall_time and the file's name. */
  clock?: () => number;
  host?: string;
  pid?: number;
}

const PREFIX = "events.out.tfevents.";

/**
 * Writes `<dir>/events.out.tfevents.<seconds>.<host>.<pid>.0`, a record at a time with an
 * append (a reader never meets half a record for long, and a killed run loses nothing it
 * wrote). The name sorts after every events file already in `dir`, so TensorBoard reads this
 * one last.
 */
export class TensorBoardWriter {
  readonly path: string;
  private readonly clock: () => number;

  /** `firstStep`: the first step this process logs (0 for a fresh run, N + 1 resuming from N). */
  constructor(dir: string, firstStep: number, options: TensorBoardOptions = {}) {
    this.clock = options.clock ?? (() => Date.now() / 1000);
    mkdirSync(dir, { recursive: true });
    const host = (options.host ?? hostname()).replace(/[^\w.-]/g, "_");
    const pid = options.pid ?? process.pid;
    const existing = readdirSync(dir).filter((f) => f.startsWith(PREFIX));
    const now = this.clock();
    let seconds = Math.floor(now);
    let name = `${PREFIX}${seconds}.${host}.${pid}.0`;
    while (existing.some((f) => f >= name)) name = `${PREFIX}${++seconds}.${host}.${pid}.0`;
    this.path = join(dir, name);
    this.append(fileVersionEvent(now));
    this.append(sessionStartEvent(now, firstStep));
  }

  /** One event with every finite metric of the row at its step. */
  log(row: Readonly<Record<string, unknown>> & { step: number }): void {
    const scalars = rowScalars(row);
    if (scalars.length > 0) this.append(scalarsEvent(this.clock(), row.step, scalars));
  }

  private append(event: Buffer): void {
    appendFileSync(this.path, tfRecord(event));
  }
}
