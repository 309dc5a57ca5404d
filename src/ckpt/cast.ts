/**
 * `--dtype` casts, bit-exact with PyTorch's CPU `tensor.to(dtype)`: every conversion goes
 * through float32 as torch's does (F64 rounds to F32 first, BF16↔F16 widen to F32), and
 * narrowing rounds to nearest, ties to even.
 */
import {
  DTYPE_SIZE,
  type DType,
  f16BitsToF32Bits,
  f32BitsToBf16,
  f32BitsToF16,
} from "../tensors/safetensors.js";
import type { OutputDType } from "./source.js";

type FloatDType = "F16" | "BF16" | "F32" | "F64";
type FloatArray = Uint16Array | Float32Array | Float64Array;

const TARGET: Readonly<Record<Exclude<OutputDType, "keep">, FloatDType>> = {
  bf16: "BF16",
  fp16: "F16",
  fp32: "F32",
};

/** Values converted per step: bounds the float32 scratch a conversion needs. */
const CHUNK = 1 << 16;

export function isFloat(dtype: DType): dtype is FloatDType {
  return dtype === "F16" || dtype === "BF16" || dtype === "F32" || dtype === "F64";
}

/** The dtype a tensor is written in: `--dtype` applies to floating-point tensors only. */
export function outputDType(src: DType, want: OutputDType): DType {
  return want === "keep" || !isFloat(src) ? src : TARGET[want];
}

/**
 * Little-endian `bytes` of `from` values as `to` values; the input itself when the dtypes
 * agree. Only floating-point dtypes convert: anything else is a caller bug.
 */
export function castBytes(bytes: Buffer, from: DType, to: DType): Buffer {
  if (from === to) return bytes;
  if (!isFloat(from) || !isFloat(to)) throw new Error(`castBytes: cannot cast ${from} to ${to}`);
  const n = bytes.length / DTYPE_SIZE[from];
  if (!Number.isInteger(n)) {
    throw new Error(`castBytes: ${bytes.length} bytes is not a whole number of ${from} values`);
  }
  const src = floatView(bytes, from);
  const out = new ArrayBuffer(n * DTYPE_SIZE[to]);
  const scratch = new Float32Array(Math.min(n, CHUNK));
  for (let start = 0; start < n; start += CHUNK) {
    const end = Math.min(n, start + CHUNK);
    encode(decode(src, from, start, end, scratch), to, out, start);
  }
  return Buffer.from(out);
}

function floatView(bytes: Buffer, dtype: FloatDType): FloatArray {
  const size = DTYPE_SIZE[dtype];
  // A typed array must start at a multiple of its element size; slices of a file or of
  // Node's buffer pool need not, so those are copied.
  const b = bytes.byteOffset % size === 0 ? bytes : new Uint8Array(bytes);
  const n = b.length / size;
  if (dtype === "F32") return new Float32Array(b.buffer, b.byteOffset, n);
  if (dtype === "F64") return new Float64Array(b.buffer, b.byteOffset, n);
  return new Uint16Array(b.buffer, b.byteOffset, n);
}

/** Values [start, end) as float32: a view of F32 input, else decoded into `scratch`. */
function decode(
  src: FloatArray,
  from: FloatDType,
  start: number,
  end: number,
  scratch: Float32Array,
): Float32Array {
  if (from === "F32") return src.subarray(start, end) as Float32Array;
  const f = scratch.subarray(0, end - start);
  if (from === "F64") {
    f.set(src.subarray(start, end)); // rounds to nearest even, as Math.fround
    return f;
  }
  const h = src as Uint16Array;
  const bits = new Uint32Array(f.buffer, 0, f.length);
  if (from === "BF16") {
    for (let i = 0; i < bits.length; i++) bits[i] = (h[start + i] as number) << 16;
  } else {
    for (let i = 0; i < bits.length; i++) bits[i] = f16BitsToF32Bits(h[start + i] as number);
  }
  return f;
}

/** Writes float32 values `f` as `to` values into `out`, from value index `start` on. */
function encode(f: Float32Array, to: FloatDType, out: ArrayBuffer, start: number): void {
  if (to === "F32" || to === "F64") {
    new (to === "F32" ? Float32Array : Float64Array)(out).set(f, start);
    return;
  }
  const bits = new Uint32Array(f.buffer, f.byteOffset, f.length);
  const h = new Uint16Array(out, start * 2, f.length);
  if (to === "BF16") {
    for (let i = 0; i < h.length; i++) h[i] = f32BitsToBf16(bits[i] as number);
  } else {
    for (let i = 0; i < h.length; i++) h[i] = f32BitsToF16(bits[i] as number);
  }
}
