// What the modes of bench:native share (CPU SFT step: run.ts; CPU RL update: rl.ts; GPU:
// gpu.ts): the model shapes they describe, and the optimiser settings of the SFT steps.

/** A Qwen2 shape; `name` labels it in the report. */
export interface Shape {
  name: string;
  vocab: number;
  hidden: number;
  intermediate: number;
  layers: number;
  heads: number;
  kvHeads: number;
  tied: boolean;
}

/** Qwen2.5-0.5B's shape (tied embeddings), which the GPU benchmarks of trainer and engine use. */
export const QWEN25_05B: Shape = {
  name: "Qwen2.5-0.5B",
  vocab: 151936,
  hidden: 896,
  intermediate: 4864,
  layers: 24,
  heads: 14,
  kvHeads: 2,
  tied: true,
};

/** A shape as the torch scripts' `make` takes it. */
export function shapeArgs(shape: Shape): string[] {
  return [
    "--vocab",
    String(shape.vocab),
    "--hidden",
    String(shape.hidden),
    "--intermediate",
    String(shape.intermediate),
    "--layers",
    String(shape.layers),
    "--heads",
    String(shape.heads),
    "--kv-heads",
    String(shape.kvHeads),
    ...(shape.tied ? ["--tied"] : []),
  ];
}

/** AdamW at lr 1e-4, weight decay 0.01, gradients clipped at norm 1.0: flags that
 * `searchr1-trainer sft` and the torch scripts' `train` take alike. */
export const STEP_FLAGS = ["--lr", "1e-4", "--weight-decay", "0.01", "--max-grad-norm", "1.0"];

/** The CPU benchmarks' shapes (the SFT step runs both; the RL update, `--rl`, the ~50M). */
export const CPU_SHAPES: Shape[] = [
  {
    name: "~10M",
    vocab: 8192,
    hidden: 256,
    intermediate: 1024,
    layers: 8,
    heads: 8,
    kvHeads: 2,
    tied: true,
  },
  {
    name: "~50M",
    vocab: 16384,
    hidden: 512,
    intermediate: 2048,
    layers: 8,
    heads: 8,
    kvHeads: 2,
    tied: false,
  },
];
