/** What every benchmark driver prints and how it starts its competitors. */

/** Progress lines go to stderr, so that stdout holds only the report. */
export const log = (msg: string) => process.stderr.write(`${msg}\n`);

/** A number with thousands separators and `digits` decimals. */
export const fmt = (n: number, digits = 0) =>
  n.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });

/**
 * The environment of a benchmark's children: both sides get the thread count from their own
 * options (--threads, torch.set_num_threads); this also caps the pools those do not reach
 * (OpenMP's, OpenBLAS's, MKL's) and quiets Hugging Face's progress output.
 */
export function threadCappedEnv(threads: number): NodeJS.ProcessEnv {
  return {
    ...process.env,
    OMP_NUM_THREADS: String(threads),
    OPENBLAS_NUM_THREADS: String(threads),
    MKL_NUM_THREADS: String(threads),
    HF_HUB_DISABLE_PROGRESS_BARS: "1",
    TRANSFORMERS_VERBOSITY: "error",
  };
}
