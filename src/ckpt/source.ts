import type { DType } from "../tensors/safetensors.js";

/**
 * One tensor of the Hugging Face model being written, named with its HF name. Its bytes
 * are produced on demand so that a conversion holds one tensor in memory at a time.
 */
export interface SourceTensor {
  name: string;
  dtype: DType;
  shape: number[];
  /** Contiguous row-major little-endian bytes, exactly numel × element size long. */
  read(): Promise<Buffer>;
}

/** `--dtype`: keep each tensor's dtype, or cast floating-point tensors to one. */
export type OutputDType = "keep" | "bf16" | "fp16" | "fp32";

/** A conversion's tensors, lazily read from files that stay open until `close()`. */
export interface Conversion {
  tensors: SourceTensor[];
  close(): Promise<void>;
}
