import { z } from "zod";

/**
 * Floating-point dtypes as every command reads them. One spelling is printed (help, errors,
 * the config reference, resolved configs): bf16, fp16, fp32, as verl's configs and the
 * native trainer's --save-dtype write them. torch's names (bfloat16, float16, float32) and
 * f16/f32 are read as the same, in any case, from flags, overrides and YAML alike.
 */
const SPELLINGS: Record<string, "bf16" | "fp16" | "fp32"> = {
  bf16: "bf16",
  bfloat16: "bf16",
  fp16: "fp16",
  float16: "fp16",
  f16: "fp16",
  fp32: "fp32",
  float32: "fp32",
  f32: "fp32",
};

/** bf16, fp16 or fp32 for any spelling of them; anything else unchanged (for validation). */
export function canonicalDtype(value: unknown): unknown {
  if (typeof value !== "string") return value;
  return SPELLINGS[value.trim().toLowerCase()] ?? value;
}

/**
 * An enum of dtype choices (bf16/fp16/fp32, plus words such as `keep`) that reads every
 * spelling of the dtypes. Help and errors list `values` only.
 */
export function dtypeEnum<const T extends readonly [string, ...string[]]>(values: T) {
  return z.preprocess(canonicalDtype, z.enum(values));
}
