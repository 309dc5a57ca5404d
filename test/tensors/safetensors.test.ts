import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { InputError } from "../../src/runtime/errors.js";
import {
  bf16ToF32,
  f16ToF32,
  f32ToBf16,
  f32ToF16,
  type NamedTensor,
  readSafetensors,
  readSafetensorsHeader,
  toFloat32,
  writeSafetensors,
  writeSafetensorsStreamed,
} from "../../src/tensors/safetensors.js";

const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-st-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let fileCount = 0;
function tmpPath(): string {
  return path.join(dir, `t${fileCount++}.safetensors`);
}

/** A file from a raw header text (unpadded) and `dataLen` data bytes. */
function rawFile(header: string | Buffer, dataLen: number): string {
  const json = Buffer.from(header);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const p = tmpPath();
  writeFileSync(p, Buffer.concat([len, json, Buffer.alloc(dataLen, 1)]));
  return p;
}

function entry(dtype: unknown, shape: unknown, offsets: unknown): Record<string, unknown> {
  return { dtype, shape, data_offsets: offsets };
}

function file(header: Record<string, unknown>, dataLen: number): string {
  return rawFile(JSON.stringify(header), dataLen);
}

const f32Of = (bits: number) => new Float32Array(new Uint32Array([bits]).buffer)[0] as number;
const bitsOf = (x: number) => new Uint32Array(new Float32Array([x]).buffer)[0] as number;

const ALL_DTYPES: NamedTensor[] = [
  { name: "f32", dtype: "F32", shape: [2, 2], data: new Float32Array([1.5, -0, f32Of(1), NaN]) },
  { name: "f16", dtype: "F16", shape: [3], data: new Uint16Array([0x3c00, 0x7c01, 0x8001]) },
  { name: "bf16", dtype: "BF16", shape: [2], data: new Uint16Array([0xff80, 0x7fc1]) },
  { name: "f64", dtype: "F64", shape: [2], data: new Float64Array([Math.PI, -1e300]) },
  {
    name: "i64",
    dtype: "I64",
    shape: [3],
    data: new BigInt64Array([-(2n ** 63n), 2n ** 63n - 1n, -1n]),
  },
  { name: "u64", dtype: "U64", shape: [1], data: new BigUint64Array([2n ** 64n - 1n]) },
  { name: "i32", dtype: "I32", shape: [2], data: new Int32Array([-(2 ** 31), 2 ** 31 - 1]) },
  { name: "u32", dtype: "U32", shape: [], data: new Uint32Array([2 ** 32 - 1]) },
  { name: "i16", dtype: "I16", shape: [2], data: new Int16Array([-32768, 32767]) },
  { name: "u16", dtype: "U16", shape: [1, 1], data: new Uint16Array([65535]) },
  { name: "i8", dtype: "I8", shape: [2], data: new Int8Array([-128, 127]) },
  { name: "u8", dtype: "U8", shape: [3], data: new Uint8Array([0, 128, 255]) },
  { name: "bool", dtype: "BOOL", shape: [3], data: new Uint8Array([1, 0, 1]) },
  { name: "empty", dtype: "F32", shape: [0, 4], data: new Float32Array(0) },
];

function bytesOf(t: NamedTensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

describe("writeSafetensors / readSafetensors", () => {
  it("round-trips every dtype bit-exactly, in order, with metadata", async () => {
    const p = tmpPath();
    await writeSafetensors(p, ALL_DTYPES, { format: "pt", note: "ünïcode" });
    const read = await readSafetensors(p);
    expect([...read.keys()]).toEqual(ALL_DTYPES.map((t) => t.name));
    for (const t of ALL_DTYPES) {
      const got = read.get(t.name);
      expect(got?.dtype).toBe(t.dtype);
      expect(got?.shape).toEqual(t.shape);
      expect(got?.data.constructor).toBe(t.data.constructor);
      expect(Buffer.from(got?.data.buffer ?? new ArrayBuffer(0)).equals(bytesOf(t))).toBe(true);
    }
    const header = await readSafetensorsHeader(p);
    expect(header.metadata).toEqual({ format: "pt", note: "ünïcode" });
  });

  it("writes the exact layout: u64 length, metadata first, offsets, space padding", async () => {
    const p = tmpPath();
    const a = new Float32Array([1, 2]);
    await writeSafetensors(p, [{ name: "a", dtype: "F32", shape: [2], data: a }], { k: "v" });
    const json = '{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}';
    const padded = json + " ".repeat((8 - (json.length % 8)) % 8);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(padded.length));
    const expected = Buffer.concat([len, Buffer.from(padded), Buffer.from(a.buffer)]);
    expect(readFileSync(p).equals(expected)).toBe(true);
  });

  it("pads every header length to a multiple of 8 and omits empty metadata", async () => {
    for (let n = 1; n <= 8; n++) {
      const p = tmpPath();
      await writeSafetensors(p, [
        { name: "x".repeat(n), dtype: "U8", shape: [1], data: new Uint8Array([7]) },
      ]);
      const buf = readFileSync(p);
      const len = Number(buf.readBigUInt64LE(0));
      const text = buf.subarray(8, 8 + len).toString();
      expect(len % 8).toBe(0);
      expect(text).toMatch(/^\{"x+":\{[^}]*\}\} {0,7}$/);
      expect(text).not.toContain("__metadata__");
      const header = await readSafetensorsHeader(p);
      expect(header.dataStart).toBe(8 + len);
      expect(header.tensors).toEqual([
        { name: "x".repeat(n), dtype: "U8", shape: [1], begin: 0, end: 1 },
      ]);
    }
  });

  it("reads tensors at unaligned offsets into aligned arrays", async () => {
    const p = tmpPath();
    await writeSafetensors(p, [
      { name: "flag", dtype: "BOOL", shape: [3], data: new Uint8Array([1, 0, 1]) },
      { name: "w", dtype: "F64", shape: [2], data: new Float64Array([0.1, -2]) },
    ]);
    const header = await readSafetensorsHeader(p);
    expect(header.tensors.map((t) => [t.begin, t.end])).toEqual([
      [0, 3],
      [3, 19],
    ]);
    const w = (await readSafetensors(p)).get("w");
    expect(w?.data).toEqual(new Float64Array([0.1, -2]));
  });

  it("keeps header order for integer-like names, which JSON.parse would reorder", async () => {
    const p = tmpPath();
    const t = (name: string): NamedTensor => ({
      name,
      dtype: "I8",
      shape: [1],
      data: new Int8Array([name.length]),
    });
    await writeSafetensors(p, [t("b"), t("10"), t("2"), t("a")]);
    expect((await readSafetensorsHeader(p)).tensors.map((x) => x.name)).toEqual([
      "b",
      "10",
      "2",
      "a",
    ]);
    const u8 = (begin: number) => JSON.stringify(entry("U8", [1], [begin, begin + 1]));
    const byHand = rawFile(`{"z":${u8(1)},"__metadata__":{},"0":${u8(0)}}`, 2);
    expect([...(await readSafetensors(byHand)).keys()]).toEqual(["z", "0"]);
  });

  it("writes subarray views with their own offset and length", async () => {
    const p = tmpPath();
    const big = new Int32Array([9, 8, 7, 6]);
    await writeSafetensors(p, [{ name: "v", dtype: "I32", shape: [2], data: big.subarray(1, 3) }]);
    expect((await readSafetensors(p)).get("v")?.data).toEqual(new Int32Array([8, 7]));
  });

  it("accepts an empty file list and whitespace-padded headers", async () => {
    const p = tmpPath();
    await writeSafetensors(p, []);
    expect(await readSafetensorsHeader(p)).toEqual({ tensors: [], metadata: {}, dataStart: 16 });
    const spaced = rawFile(' {\n "a" : {"dtype":"U8","shape":[2],"data_offsets":[0,2]} }   ', 2);
    expect((await readSafetensors(spaced)).get("a")?.data).toEqual(new Uint8Array([1, 1]));
  });
});

describe("safetensors validation", () => {
  async function fails(p: string, message: string): Promise<void> {
    const err = await readSafetensorsHeader(p).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InputError);
    expect((err as Error).message).toBe(message.replace("$", p));
    await expect(readSafetensors(p)).rejects.toThrow(message.replace("$", p));
  }

  const f32 = (shape: unknown, offsets: unknown) => entry("F32", shape, offsets);

  it("rejects missing, non-regular and short files", async () => {
    await fails(path.join(dir, "missing.safetensors"), "$: no such file");
    const sub = path.join(dir, "sub.safetensors");
    mkdirSync(sub);
    await fails(sub, "$: cannot read (not a regular file)");
    const short = tmpPath();
    writeFileSync(short, "abc");
    await fails(short, "$: file is 3 bytes, too short for a safetensors header");
  });

  it("rejects header lengths over the limit or past the end", async () => {
    const huge = tmpPath();
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(100_000_001n);
    writeFileSync(huge, Buffer.concat([len, Buffer.from("{}")]));
    await fails(huge, "$: header length 100000001 exceeds the limit of 100000000 bytes");
    const past = tmpPath();
    len.writeBigUInt64LE(10n);
    writeFileSync(past, Buffer.concat([len, Buffer.from("{}")]));
    await fails(past, "$: header length 10 runs past the end of the 10-byte file");
  });

  it("rejects headers that are not UTF-8 JSON objects", async () => {
    const p = rawFile('{"a":', 0);
    const err = await readSafetensorsHeader(p).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InputError);
    expect((err as Error).message).toMatch(/: header: invalid JSON: .*JSON/);
    expect((err as Error).message.startsWith(`${p}: header: invalid JSON: `)).toBe(true);
    await fails(rawFile("[]", 0), "$: header is not a JSON object");
    const badUtf8 = Buffer.concat([Buffer.from('{"'), Buffer.from([0xff]), Buffer.from('":1}')]);
    await fails(rawFile(badUtf8, 0), "$: header is not valid UTF-8");
  });

  it("rejects duplicate tensor names", async () => {
    const p = rawFile(
      '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' +
        '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
      2,
    );
    await fails(p, '$: header: duplicate key "a"');
  });

  it("rejects malformed entries, naming the tensor", async () => {
    await fails(file({ a: 3 }, 0), "$: tensor 'a': entry must be an object");
    await fails(
      file({ a: { shape: [1], data_offsets: [0, 4] } }, 4),
      `$: tensor 'a': missing "dtype"`,
    );
    await fails(
      file({ a: { dtype: "F32", data_offsets: [0, 4] } }, 4),
      `$: tensor 'a': missing "shape"`,
    );
    await fails(
      file({ a: { dtype: "F32", shape: [1] } }, 4),
      `$: tensor 'a': missing "data_offsets"`,
    );
    await fails(file({ a: entry(7, [1], [0, 4]) }, 4), `$: tensor 'a': "dtype" must be a string`);
    await fails(
      file({ "x.w": entry("F8_E4M3", [1], [0, 1]) }, 1),
      "$: tensor 'x.w': unknown or unsupported dtype 'F8_E4M3'",
    );
    await fails(
      file({ a: f32(3, [0, 4]) }, 4),
      `$: tensor 'a': "shape" must be an array of integers`,
    );
    await fails(
      file({ a: f32([1.5], [0, 4]) }, 4),
      "$: tensor 'a': shape entry must be an integer; got 1.5",
    );
    await fails(
      file({ a: f32(["1"], [0, 4]) }, 4),
      "$: tensor 'a': shape entry must be an integer",
    );
    await fails(
      file({ a: f32([2, -1], [0, 4]) }, 4),
      "$: tensor 'a': shape [2, -1] has a negative dimension",
    );
    await fails(
      file({ a: f32([1], [0, 4, 8]) }, 4),
      `$: tensor 'a': "data_offsets" must be [begin, end]`,
    );
    await fails(
      file({ a: f32([1], "0,4") }, 4),
      `$: tensor 'a': "data_offsets" must be [begin, end]`,
    );
  });

  it("rejects offsets that disagree with the dtype, shape or data buffer", async () => {
    await fails(
      file({ a: f32([1], [4, 0]) }, 4),
      "$: tensor 'a': data_offsets [4, 0] are not an ordered range",
    );
    await fails(
      file({ a: f32([1], [-4, 0]) }, 4),
      "$: tensor 'a': data_offsets [-4, 0] are not an ordered range",
    );
    await fails(
      file({ "a.weight": f32([2, 2], [0, 12]) }, 12),
      "$: tensor 'a.weight': data_offsets [0, 12] hold 12 bytes but F32 [2, 2] needs 16",
    );
    await fails(
      file({ a: f32([2], [0, 8]) }, 4),
      "$: tensor 'a': data_offsets end 8 is past the end of the data (4 bytes)",
    );
    await fails(
      file({ a: f32([2], [0, 8]), b: f32([1], [4, 8]) }, 8),
      "$: tensor 'b': data overlaps tensor 'a'",
    );
    await fails(
      file({ a: f32([1], [0, 4]), b: f32([1], [8, 12]) }, 12),
      "$: tensor 'b': data starts at 8 leaving a gap after byte 4",
    );
    await fails(file({ a: f32([1], [0, 4]) }, 6), "$: tensors cover 4 of the 6 data bytes");
    await fails(file({}, 3), "$: tensors cover 0 of the 3 data bytes");
  });

  it("accepts tensors listed out of data order, and empty tensors anywhere", async () => {
    const p = file({ b: f32([1], [4, 8]), z: f32([0], [4, 4]), a: f32([1], [0, 4]) }, 8);
    const header = await readSafetensorsHeader(p);
    expect(header.tensors.map((t) => t.name)).toEqual(["b", "z", "a"]);
  });

  it("requires __metadata__ to map strings to strings", async () => {
    await fails(
      file({ __metadata__: { k: 1 } }, 0),
      `$: "__metadata__": value of 'k' must be a string`,
    );
    await fails(file({ __metadata__: [] }, 0), `$: "__metadata__" must be an object of strings`);
  });
});

describe("writeSafetensors failures", () => {
  const one = (over: Partial<NamedTensor> = {}): NamedTensor => ({
    name: "a",
    dtype: "F32",
    shape: [1],
    data: new Float32Array(1),
    ...over,
  });

  it("reports an unwritable path as an InputError and leaves no temporary file", async () => {
    const p = path.join(dir, "no-such-dir", "x.safetensors");
    const err = await writeSafetensors(p, [one()]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InputError);
    expect((err as Error).message).toBe(`${p}: cannot write (ENOENT)`);

    const sub = mkdtempSync(path.join(dir, "w-"));
    const target = path.join(sub, "taken.safetensors");
    mkdirSync(target); // rename onto a folder fails after the data is written
    await expect(writeSafetensors(target, [one()])).rejects.toThrow(
      `${target}: cannot write (EISDIR)`,
    );
    expect(readdirSync(sub)).toEqual(["taken.safetensors"]);
  });

  it("replaces an existing file", async () => {
    const p = tmpPath();
    await writeSafetensors(p, [one()]);
    await writeSafetensors(p, [one({ name: "b" })]);
    expect([...(await readSafetensors(p)).keys()]).toEqual(["b"]);
    expect(readdirSync(dir).filter((f) => f.includes(".tmp-"))).toEqual([]);
  });

  it("rejects tensors whose data does not match (a caller bug, so a plain Error)", async () => {
    const cases: [NamedTensor[], string][] = [
      [[one(), one()], "safetensors: tensor 'a': the name is repeated"],
      [[one({ name: "__metadata__" })], "safetensors: tensor '__metadata__': the name is reserved"],
      [[one({ shape: [-1] })], "safetensors: tensor 'a': shape [-1] is not a list of sizes"],
      [[one({ shape: [0.5] })], "safetensors: tensor 'a': shape [0.5] is not a list of sizes"],
      [[one({ dtype: "BF16" })], "safetensors: tensor 'a': BF16 data must be a Uint16Array"],
      [[one({ shape: [2] })], "safetensors: tensor 'a': 1 values for F32 [2] (wants 2)"],
    ];
    for (const [tensors, message] of cases) {
      const p = tmpPath();
      const err = await writeSafetensors(p, tensors).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(InputError);
      expect((err as Error).message).toBe(message);
    }
  });
});

describe("writeSafetensorsStreamed", () => {
  const entries = [
    { name: "a", dtype: "F32" as const, shape: [2] },
    { name: "b", dtype: "U8" as const, shape: [3] },
  ];
  const data = [new Uint8Array(new Float32Array([1, -2]).buffer), new Uint8Array([7, 8, 9])];

  it("asks for each tensor's bytes in order, once the previous one is written", async () => {
    const p = tmpPath();
    const asked: [number, number][] = [];
    await writeSafetensorsStreamed(
      p,
      entries,
      async (i) => {
        asked.push([i, statSync(`${p}.tmp-${process.pid}`).size]);
        return data[i] as Uint8Array;
      },
      { format: "pt" },
    );
    const header = await readSafetensorsHeader(p);
    expect(asked).toEqual([
      [0, header.dataStart],
      [1, header.dataStart + 8],
    ]);
    expect(header.metadata).toEqual({ format: "pt" });
    const read = await readSafetensors(p);
    expect(read.get("a")?.data).toEqual(new Float32Array([1, -2]));
    expect(read.get("b")?.data).toEqual(new Uint8Array([7, 8, 9]));
  });

  it("passes errors of `next` through and rejects bytes of the wrong length, leaving no file", async () => {
    const p = tmpPath();
    const own = new InputError("reader failed");
    await expect(
      writeSafetensorsStreamed(p, entries, async (i) => {
        if (i === 1) throw own;
        return data[0] as Uint8Array;
      }),
    ).rejects.toBe(own);
    const err = await writeSafetensorsStreamed(p, entries, async () => new Uint8Array(5)).catch(
      (e: unknown) => e,
    );
    expect(err).not.toBeInstanceOf(InputError);
    expect((err as Error).message).toBe("safetensors: tensor 'a': 5 bytes for F32 [2] (wants 8)");
    expect(readdirSync(dir).filter((f) => f.startsWith(path.basename(p)))).toEqual([]);
  });
});

// Expected bits from PyTorch 1.13 / NumPy 1.24 (float32 -> half types, round to nearest
// even). NaN rows instead follow x86 F16C / AVX512-BF16: quiet NaN, sign and top payload
// bits kept (torch 1.13 writes 0xffff for every bf16 NaN; any NaN is acceptable there).
const F32_TO_BF16: [number, number][] = [
  [0x3f800000, 0x3f80], // 1
  [0x3f808000, 0x3f80], // tie, rounds down to even
  [0x3f818000, 0x3f82], // tie, rounds up to even
  [0x3f808001, 0x3f81], // just above the tie
  [0x3f80ffff, 0x3f81],
  [0x7f7fffff, 0x7f80], // max float32 overflows to inf
  [0x7f7f7fff, 0x7f7f],
  [0x7f7f8000, 0x7f80], // tie at the top rounds to inf
  [0x00000001, 0x0000], // smallest subnormal
  [0x00008000, 0x0000], // subnormal tie, to even
  [0x00018000, 0x0002],
  [0x00008001, 0x0001],
  [0x007fffff, 0x0080], // largest subnormal rounds up to the smallest normal
  [0x80000000, 0x8000], // -0
  [0x7f800000, 0x7f80], // inf
  [0xff800000, 0xff80], // -inf
  [0xc0490fdb, 0xc049], // -pi
  [0x3dcccccd, 0x3dcd], // 0.1
  [0x7fc00000, 0x7fc0], // NaN
  [0xffc00000, 0xffc0], // -NaN
  [0x7f800001, 0x7fc0], // signalling NaN, made quiet
];

const F32_TO_F16: [number, number][] = [
  [0x3f800000, 0x3c00], // 1
  [0x477fe000, 0x7bff], // 65504, the largest half
  [0x477fefff, 0x7bff], // just below the overflow tie
  [0x477ff000, 0x7c00], // 65520: tie, rounds to inf
  [0x47800000, 0x7c00], // 65536
  [0x33800000, 0x0001], // 2^-24, smallest subnormal
  [0x33000000, 0x0000], // 2^-25: tie, to even (zero)
  [0x33000001, 0x0001],
  [0x33c00000, 0x0002], // 3 * 2^-25: tie, to even (2)
  [0x387fc000, 0x03ff], // largest subnormal
  [0x387fe000, 0x0400], // tie between it and the smallest normal
  [0x38800000, 0x0400], // 2^-14, smallest normal
  [0x3f801000, 0x3c00], // 1 + 2^-11: tie, down to even
  [0x3f803000, 0x3c02], // 1 + 3 * 2^-11: tie, up to even
  [0x3f801001, 0x3c01],
  [0x3dcccccd, 0x2e66], // 0.1
  [0x3eaaaaab, 0x3555], // 1/3
  [0x80000000, 0x8000], // -0
  [0xb3000001, 0x8001], // negative subnormal
  [0x00000001, 0x0000], // float32 subnormal underflows to zero
  [0x7f800000, 0x7c00], // inf
  [0xff800000, 0xfc00], // -inf
  [0x7fc00000, 0x7e00], // NaN
  [0xffc00000, 0xfe00], // -NaN
  [0x7f800001, 0x7e00], // signalling NaN, made quiet
];

const F16_TO_F32: [number, number][] = [
  [0x0000, 0x00000000],
  [0x8000, 0x80000000],
  [0x0001, 0x33800000], // 2^-24
  [0x8001, 0xb3800000],
  [0x03ff, 0x387fc000], // largest subnormal
  [0x0400, 0x38800000],
  [0x3c00, 0x3f800000],
  [0x3555, 0x3eaaa000],
  [0x7bff, 0x477fe000], // 65504
  [0xfbff, 0xc77fe000],
  [0x7c00, 0x7f800000],
  [0xfc00, 0xff800000],
  [0x7e00, 0x7fc00000],
  [0xfe00, 0xffc00000],
];

const hex = (n: number) => `0x${n.toString(16)}`;

describe("half-precision conversions", () => {
  it("rounds float32 to bfloat16 to nearest even, with inf and NaN", () => {
    for (const [input, want] of F32_TO_BF16) {
      expect(hex(f32ToBf16(f32Of(input))), hex(input)).toBe(hex(want));
    }
  });

  it("rounds float32 to half to nearest even, subnormals, overflow and NaN included", () => {
    for (const [input, want] of F32_TO_F16) {
      expect(hex(f32ToF16(f32Of(input))), hex(input)).toBe(hex(want));
    }
  });

  it("decodes half and bfloat16 exactly", () => {
    for (const [input, want] of F16_TO_F32) {
      expect(hex(bitsOf(f16ToF32(input))), hex(input)).toBe(hex(want));
    }
    expect(bf16ToF32(0x3f80)).toBe(1);
    expect(bitsOf(bf16ToF32(0x8001))).toBe(0x80010000);
    expect(bf16ToF32(0xff80)).toBe(-Infinity);
    expect(bf16ToF32(0x7fc0)).toBeNaN();
  });

  it("round-trips every non-NaN half and bfloat16 bit pattern", () => {
    for (let h = 0; h < 0x10000; h++) {
      const f16Nan = (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
      if (!f16Nan && f32ToF16(f16ToF32(h)) !== h) throw new Error(`f16 ${hex(h)}`);
      const bfNan = (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;
      if (!bfNan && f32ToBf16(bf16ToF32(h)) !== h) throw new Error(`bf16 ${hex(h)}`);
      if (bfNan && !Number.isNaN(bf16ToF32(h))) throw new Error(`bf16 NaN ${hex(h)}`);
    }
  });

  it("rounds a float64 argument to float32 first", () => {
    // 1 + 2^-8 + 2^-30 rounds to the bf16 tie 1 + 2^-8 in float32, then down to even.
    expect(hex(f32ToBf16(1 + 2 ** -8 + 2 ** -30))).toBe("0x3f80");
  });

  it("converts tensors of every dtype to float32", () => {
    const conv = (t: NamedTensor) => Array.from(toFloat32(t));
    const get = (name: string) => ALL_DTYPES.find((t) => t.name === name) as NamedTensor;
    expect(conv(get("f16"))).toEqual([1, NaN, 2 ** -24 * -1]);
    expect(conv(get("bf16"))).toEqual([-Infinity, NaN]);
    expect(conv(get("f64"))).toEqual([Math.fround(Math.PI), -Infinity]);
    expect(conv(get("i64"))).toEqual([-(2 ** 63), 2 ** 63, -1]);
    expect(conv(get("u64"))).toEqual([2 ** 64]);
    expect(conv(get("i32"))).toEqual([-(2 ** 31), 2 ** 31]);
    expect(conv(get("u8"))).toEqual([0, 128, 255]);
    expect(conv(get("bool"))).toEqual([1, 0, 1]);
    expect(conv(get("empty"))).toEqual([]);
    const f32 = get("f32");
    expect(toFloat32(f32)).toBe(f32.data);
  });
});
