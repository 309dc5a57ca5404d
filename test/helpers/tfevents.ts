// A reader of TensorBoard event files for the tests: TFRecord frames (both CRCs checked) and
// the Event fields src/tracking/tensorboard.ts writes. The real `tensorboard` package reads the
// committed fixtures (test/tracking/read_tfevents.py); this checks a train run's own files.
import { readFileSync } from "node:fs";
import { maskedCrc32c } from "../../src/tracking/tensorboard.js";

export interface TfEvent {
  wallTime?: number;
  step?: number;
  fileVersion?: string;
  /** SessionLog status (1 = START). */
  sessionStatus?: number;
  /** Summary values: tag and simple_value (a float32). */
  values: { tag: string; value: number }[];
}

/** The records of a TFRecord file, each checked against its masked CRC-32Cs. */
export function tfRecords(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < bytes.length; ) {
    const length = Number(bytes.readBigUInt64LE(at));
    if (bytes.readUInt32LE(at + 8) !== maskedCrc32c(bytes.subarray(at, at + 8))) {
      throw new Error(`bad length CRC at byte ${at}`);
    }
    const data = bytes.subarray(at + 12, at + 12 + length);
    if (bytes.readUInt32LE(at + 12 + length) !== maskedCrc32c(data)) {
      throw new Error(`bad data CRC at byte ${at}`);
    }
    out.push(data);
    at += 12 + length + 4;
  }
  return out;
}

interface Field {
  field: number;
  wire: number;
  varint?: bigint;
  fixed?: Buffer;
  bytes?: Buffer;
}

function fields(buf: Buffer): Field[] {
  const out: Field[] = [];
  let at = 0;
  const varint = (): bigint => {
    let v = 0n;
    for (let shift = 0n; ; shift += 7n) {
      const b = buf[at++] as number;
      v |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return v;
    }
  };
  while (at < buf.length) {
    const key = Number(varint());
    const [field, wire] = [key >> 3, key & 7];
    if (wire === 0) out.push({ field, wire, varint: varint() });
    else if (wire === 1 || wire === 5) {
      const n = wire === 1 ? 8 : 4;
      out.push({ field, wire, fixed: buf.subarray(at, at + n) });
      at += n;
    } else if (wire === 2) {
      const n = Number(varint());
      out.push({ field, wire, bytes: buf.subarray(at, at + n) });
      at += n;
    } else throw new Error(`wire type ${wire}`);
  }
  return out;
}

export function decodeEvent(data: Buffer): TfEvent {
  const event: TfEvent = { values: [] };
  for (const f of fields(data)) {
    if (f.field === 1) event.wallTime = f.fixed?.readDoubleLE(0);
    else if (f.field === 2) event.step = Number(BigInt.asIntN(64, f.varint ?? 0n));
    else if (f.field === 3) event.fileVersion = f.bytes?.toString("utf8");
    else if (f.field === 7) {
      for (const s of fields(f.bytes as Buffer))
        if (s.field === 1) event.sessionStatus = Number(s.varint);
    } else if (f.field === 5) {
      for (const v of fields(f.bytes as Buffer)) {
        if (v.field !== 1) continue;
        let tag = "";
        let value = Number.NaN;
        for (const x of fields(v.bytes as Buffer)) {
          if (x.field === 1) tag = x.bytes?.toString("utf8") ?? "";
          if (x.field === 2) value = x.fixed?.readFloatLE(0) ?? Number.NaN;
        }
        event.values.push({ tag, value });
      }
    }
  }
  return event;
}

export function readEvents(path: string): TfEvent[] {
  return tfRecords(readFileSync(path)).map(decodeEvent);
}
