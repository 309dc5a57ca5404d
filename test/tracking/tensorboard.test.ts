// TensorBoard event files (src/tracking/tensorboard.ts) against what the real `tensorboard`
// package reads back from them: test/tracking/read_tfevents.py read the committed files in
// fixtures/tensorboard/events/ into fixtures/tensorboard/read-back.json. Here the writer must
// still write those very bytes from the same rows, and what TensorBoard read must be what
// the rows held (as float32), with the resumed process's points replacing the first one's.
// SEARCHR1_WRITE_FIXTURES=1 rewrites the event files (then rerun the Python script).
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import {
  crc32c,
  maskedCrc32c,
  rowScalars,
  TensorBoardWriter,
  tfRecord,
} from "../../src/tracking/tensorboard.js";
import { readEvents, tfRecords } from "../helpers/tfevents.js";

const FIXTURES = fileURLToPath(new URL("fixtures/tensorboard/", import.meta.url));
const EVENTS = path.join(FIXTURES, "events");

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

type Row = { step: number } & Record<string, number | null>;

/** Two processes of one run: the first logs steps 0–3, the second resumes from step 2. */
const FIRST: Row[] = [
  { step: 0, "val/em/mean": 0.25, "val/em/nq": 0.5 },
  {
    step: 1,
    epoch: 0,
    "reward/mean": 0.1,
    "actor/entropy": 0.61,
    "actor/grad_norm": 1.5,
    "actor/kl_loss": null,
    "actor/lr": 1e-6,
  },
  {
    step: 2,
    epoch: 0,
    "reward/mean": 0.2,
    "actor/entropy": 0.55,
    "actor/grad_norm": 2.25,
    "rollout/logprob_gap": Number.NaN,
    "actor/lr": 1e-6,
  },
  { step: 3, epoch: 1, "reward/mean": 0.3, "actor/entropy": 0.5, "actor/grad_norm": 1e30 },
];
const RESUMED_FROM = 2;
const SECOND: Row[] = [
  { step: 3, epoch: 1, "reward/mean": 0.35, "actor/entropy": 0.52, "actor/grad_norm": 1.75 },
  { step: 4, epoch: 1, "reward/mean": 0.4, "actor/entropy": 0.45, "actor/grad_norm": 1.25 },
];

/** Writes the two processes' files into `dir` with fixed clocks, host and pids. */
function writeRun(dir: string): void {
  const clock = (start: number) => {
    let t = start;
    return () => {
      const now = t;
      t += 0.5;
      return now;
    };
  };
  const first = new TensorBoardWriter(dir, 0, {
    clock: clock(1_700_000_000),
    host: "fixture",
    pid: 100,
  });
  for (const row of FIRST) first.log(row);
  const second = new TensorBoardWriter(dir, RESUMED_FROM + 1, {
    clock: clock(1_700_000_100),
    host: "fixture",
    pid: 101,
  });
  for (const row of SECOND) second.log(row);
}

describe("TFRecord framing", () => {
  it("CRC-32C and its mask", () => {
    // RFC 3720 B.4 and the classic check value
    expect(crc32c(Buffer.from("123456789"))).toBe(0xe3069283);
    expect(crc32c(Buffer.alloc(32))).toBe(0x8a9136aa);
    expect(crc32c(Buffer.alloc(32, 0xff))).toBe(0x62a8ab43);
    const crc = 0xe3069283;
    expect(maskedCrc32c(Buffer.from("123456789"))).toBe(
      ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0,
    );
  });

  it("frames a record: length, its CRC, data, its CRC", () => {
    const record = tfRecord(Buffer.from("hello"));
    expect(record.length).toBe(8 + 4 + 5 + 4);
    expect(record.readBigUInt64LE(0)).toBe(5n);
    expect(tfRecords(record)).toEqual([Buffer.from("hello")]);
    record[14] ^= 1;
    expect(() => tfRecords(record)).toThrow(/bad data CRC/);
  });

  it("a row's scalars: its finite numbers, step and epoch left out", () => {
    expect(rowScalars(FIRST[2] as Row)).toEqual([
      ["reward/mean", 0.2],
      ["actor/entropy", 0.55],
      ["actor/grad_norm", 2.25],
      ["actor/lr", 1e-6],
    ]);
  });
});

describe("event files", () => {
  it("are the committed fixture's bytes", () => {
    if (process.env.SEARCHR1_WRITE_FIXTURES === "1") {
      rmSync(EVENTS, { recursive: true, force: true });
      mkdirSync(EVENTS, { recursive: true });
      writeRun(EVENTS);
    }
    const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-tb-"));
    dirs.push(dir);
    writeRun(dir);
    const names = readdirSync(dir).sort();
    expect(names).toEqual([
      "events.out.tfevents.1700000000.fixture.100.0",
      "events.out.tfevents.1700000100.fixture.101.0",
    ]);
    expect(readdirSync(EVENTS).sort()).toEqual(names);
    for (const name of names) {
      expect(readFileSync(path.join(dir, name)), name).toEqual(
        readFileSync(path.join(EVENTS, name)),
      );
    }
  });

  it("read back by TensorBoard, hold every finite metric per step; the resumed process's win", () => {
    const readBack = JSON.parse(readFileSync(path.join(FIXTURES, "read-back.json"), "utf8")) as {
      files: string[];
      scalars: Record<string, [number, number, number][]>;
    };
    expect(readBack.files).toEqual(readdirSync(EVENTS).sort());
    // What TensorBoard should show: the first process's rows before the resumed step, then
    // the second's; every finite number as a float32, at the writer's wall times.
    const expected: Record<string, [number, number][]> = {};
    const rows = [...FIRST.filter((r) => r.step <= RESUMED_FROM), ...SECOND];
    for (const row of rows) {
      for (const [tag, value] of rowScalars(row)) {
        expected[tag] = [...(expected[tag] ?? []), [row.step, Math.fround(value)]];
      }
    }
    const got = Object.fromEntries(
      Object.entries(readBack.scalars).map(([tag, points]) => [
        tag,
        points.map(([step, value]) => [step, value]),
      ]),
    );
    expect(got).toEqual(expected);
    expect(Object.keys(got)).not.toContain("rollout/logprob_gap"); // NaN: left out
    expect(Object.keys(got)).not.toContain("actor/kl_loss"); // null: left out
    expect(readBack.scalars["reward/mean"]?.map(([, , wall]) => wall)).toEqual([
      1_700_000_001, 1_700_000_001.5, 1_700_000_100.5, 1_700_000_101,
    ]);
  });

  it("start with the version and a SessionLog START at the first step each process logs", () => {
    const [first, second] = readdirSync(EVENTS)
      .sort()
      .map((f) => readEvents(path.join(EVENTS, f)));
    expect(first?.[0]).toMatchObject({ fileVersion: "brain.Event:2", wallTime: 1_700_000_000 });
    expect(first?.[1]).toMatchObject({ step: 0, sessionStatus: 1 });
    expect(second?.[1]).toMatchObject({ step: 3, sessionStatus: 1 });
    expect(first?.slice(2).map((e) => e.step)).toEqual([0, 1, 2, 3]);
    expect(second?.slice(2).map((e) => e.values.map((v) => v.tag))).toEqual([
      ["reward/mean", "actor/entropy", "actor/grad_norm"],
      ["reward/mean", "actor/entropy", "actor/grad_norm"],
    ]);
  });

  it("a new file sorts after the folder's existing ones, even at the same second", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-tb-"));
    dirs.push(dir);
    writeFileSync(path.join(dir, "events.out.tfevents.1700000000.zzz.9.0"), "");
    const w = new TensorBoardWriter(dir, 0, { clock: () => 1_700_000_000, host: "aaa", pid: 1 });
    expect(path.basename(w.path)).toBe("events.out.tfevents.1700000001.aaa.1.0");
  });
});
