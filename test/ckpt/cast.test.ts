import { readdirSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { castBytes, outputDType } from "../../src/ckpt/cast.js";
import {
  type DType,
  f32ToBf16,
  readSafetensors,
  type Tensor,
} from "../../src/tensors/safetensors.js";

const FIXTURES = path.join(import.meta.dirname, "fixtures");

const f32 = (...bits: number[]) => Buffer.from(new Uint32Array(bits).buffer);
const u16 = (...bits: number[]) => Buffer.from(new Uint16Array(bits).buffer);
const f64 = (...values: number[]) => Buffer.from(new Float64Array(values).buffer);
const floatBits = (x: number) => new Uint32Array(new Float32Array([x]).buffer)[0] as number;

function bytesOf(t: Tensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** Every tensor of a fixture model folder (all its shards), by name. */
async function modelTensors(dir: string): Promise<Map<string, Tensor>> {
  const out = new Map<string, Tensor>();
  for (const file of readdirSync(dir)
    .filter((f) => f.endsWith(".safetensors"))
    .sort()) {
    for (const [name, t] of await readSafetensors(path.join(dir, file))) out.set(name, t);
  }
  return out;
}

describe("outputDType", () => {
  it("casts floating-point dtypes only, and keeps everything with keep", () => {
    expect(outputDType("F32", "bf16")).toBe("BF16");
    expect(outputDType("BF16", "fp16")).toBe("F16");
    expect(outputDType("F64", "fp32")).toBe("F32");
    expect(outputDType("F16", "fp32")).toBe("F32");
    expect(outputDType("F16", "keep")).toBe("F16");
    for (const dtype of ["I64", "I32", "U8", "BOOL"] as DType[]) {
      expect(outputDType(dtype, "bf16")).toBe(dtype);
    }
  });
});

describe("castBytes", () => {
  it("rounds float32 to bfloat16 to nearest even, overflowing to inf", () => {
    const cases: [number, number][] = [
      [0x3f808000, 0x3f80], // 1 + 2^-8: a tie, down to even
      [0x3f818000, 0x3f82], // 1 + 3·2^-8: a tie, up to even
      [0xbf808000, 0xbf80], // negative ties alike
      [0xbf818000, 0xbf82],
      [0x3f808001, 0x3f81], // just above a tie
      [0x7f7fffff, 0x7f80], // float32 max rounds past bfloat16 max
      [0xff7fffff, 0xff80],
      [0x7f800000, 0x7f80], // ±inf, ±0
      [0xff800000, 0xff80],
      [0x00000000, 0x0000],
      [0x80000000, 0x8000],
      [0x00000001, 0x0000], // float32 denormal
    ];
    const got = castBytes(f32(...cases.map((c) => c[0])), "F32", "BF16");
    expect([...new Uint16Array(got.buffer, got.byteOffset, cases.length)]).toEqual(
      cases.map((c) => c[1]),
    );
  });

  it("rounds float32 to half to nearest even, with subnormals and overflow", () => {
    const cases: [number, number][] = [
      [1 + 2 ** -11, 0x3c00], // ties, down and up to even
      [1 + 3 * 2 ** -11, 0x3c02],
      [-(1 + 2 ** -11), 0xbc00],
      [65504, 0x7bff],
      [65519.99, 0x7bff],
      [65520, 0x7c00], // first value past the max rounds to inf
      [-65520, 0xfc00],
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // a tie with zero, to even
      [3 * 2 ** -25, 0x0002], // a subnormal tie, up to even
      [3e-8, 0x0001],
      [2 ** -14, 0x0400], // smallest normal
      [6e-5, 0x03ef], // 1006.6 units of 2^-24
      [-0, 0x8000],
      [Number.POSITIVE_INFINITY, 0x7c00],
      [Number.NEGATIVE_INFINITY, 0xfc00],
    ];
    const got = castBytes(f32(...cases.map((c) => floatBits(c[0]))), "F32", "F16");
    expect([...new Uint16Array(got.buffer, got.byteOffset, cases.length)]).toEqual(
      cases.map((c) => c[1]),
    );
  });

  it("widens half and bfloat16 exactly, subnormals included", () => {
    const half = castBytes(u16(0x0001, 0x03ff, 0x8000, 0x7bff, 0xfc00), "F16", "F32");
    expect([...new Float32Array(half.buffer, half.byteOffset, 5)]).toEqual([
      2 ** -24,
      1023 * 2 ** -24,
      -0,
      65504,
      Number.NEGATIVE_INFINITY,
    ]);
    const bf = castBytes(u16(0x3f81, 0x0001, 0xff80), "BF16", "F64");
    expect([...new Float64Array(bf.buffer, bf.byteOffset, 3)]).toEqual([
      1 + 2 ** -7,
      2 ** -133,
      Number.NEGATIVE_INFINITY,
    ]);
  });

  it("goes between bfloat16 and half through float32", () => {
    // 65504 (half max) is 65536 in bfloat16; 65536 overflows half; 2^-24 is a half subnormal.
    const toBf = castBytes(u16(0x7bff, 0x3c01, 0x0001), "F16", "BF16");
    expect([...new Uint16Array(toBf.buffer, toBf.byteOffset, 3)]).toEqual([0x4780, 0x3f80, 0x3380]);
    const toHalf = castBytes(u16(0x4780, 0x3f81, 0x3380), "BF16", "F16");
    expect([...new Uint16Array(toHalf.buffer, toHalf.byteOffset, 3)]).toEqual([
      0x7c00, 0x3c08, 0x0001,
    ]);
  });

  it("rounds float64 to float32 first, as torch does", () => {
    const x = 1 + 2 ** -8 + 2 ** -30; // above a bfloat16 tie, but a tie once in float32
    const toF32 = castBytes(f64(x, 0.1, 1e300), "F64", "F32");
    expect([...new Float32Array(toF32.buffer, toF32.byteOffset, 3)]).toEqual([
      Math.fround(x),
      Math.fround(0.1),
      Number.POSITIVE_INFINITY,
    ]);
    const toBf = castBytes(f64(x), "F64", "BF16");
    expect(toBf.readUInt16LE(0)).toBe(0x3f80);
    const back = castBytes(f32(floatBits(0.1)), "F32", "F64");
    expect(back.readDoubleLE(0)).toBe(Math.fround(0.1));
  });

  it("returns the input itself when the dtypes agree", () => {
    const b = f32(1, 2);
    expect(castBytes(b, "F32", "F32")).toBe(b);
    expect(castBytes(b, "I64", "I64")).toBe(b);
  });

  it("handles unaligned input and many chunks", () => {
    const n = 200_003;
    const values = Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 2 ** ((i % 60) - 30));
    const unaligned = Buffer.alloc(n * 4 + 1).subarray(1);
    Buffer.from(values.buffer).copy(unaligned);
    const got = castBytes(unaligned, "F32", "BF16");
    expect(got.length).toBe(n * 2);
    for (let i = 0; i < n; i += 997) {
      expect(got.readUInt16LE(i * 2)).toBe(f32ToBf16(values[i] as number));
    }
    expect(got.readUInt16LE((n - 1) * 2)).toBe(f32ToBf16(values[n - 1] as number));
  });

  it("rejects non-float casts and partial values (caller bugs)", () => {
    expect(() => castBytes(Buffer.alloc(8), "I64", "F32")).toThrow(
      "castBytes: cannot cast I64 to F32",
    );
    expect(() => castBytes(Buffer.alloc(6), "F32", "BF16")).toThrow(
      "castBytes: 6 bytes is not a whole number of F32 values",
    );
  });
});

describe("castBytes against PyTorch (test/ckpt/fixtures/cast)", () => {
  const cases: [string, string, DType][] = [
    ["untied-bf16", "untied", "BF16"],
    ["untied-fp16", "untied", "F16"],
    ["tied-fp32", "tied", "F32"],
  ];
  it.each(cases)("%s.safetensors is hf/%s cast bit-exactly", async (file, model, to) => {
    const want = await readSafetensors(path.join(FIXTURES, "cast", `${file}.safetensors`));
    const source = await modelTensors(path.join(FIXTURES, "hf", model));
    expect([...want.keys()].sort()).toEqual([...source.keys()].sort());
    for (const [name, t] of source) {
      const ref = want.get(name) as Tensor;
      expect(ref.dtype).toBe(to);
      expect(castBytes(bytesOf(t), t.dtype, to).equals(bytesOf(ref)), name).toBe(true);
    }
  });

  it("edge.safetensors: ties, overflow, subnormals, signed zeros and infinities", async () => {
    const e = await readSafetensors(path.join(FIXTURES, "cast", "edge.safetensors"));
    const x = bytesOf(e.get("x") as Tensor);
    const steps: [string, Buffer, DType, DType][] = [
      ["x.bf16", x, "F32", "BF16"],
      ["x.fp16", x, "F32", "F16"],
      ["x.bf16.f32", bytesOf(e.get("x.bf16") as Tensor), "BF16", "F32"],
      ["x.fp16.f32", bytesOf(e.get("x.fp16") as Tensor), "F16", "F32"],
    ];
    for (const [name, input, from, to] of steps) {
      expect(castBytes(input, from, to).equals(bytesOf(e.get(name) as Tensor)), name).toBe(true);
    }
  });
});
