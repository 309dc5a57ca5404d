// What the CPU (run.ts) and GPU (gpu.ts) modes of bench:native share: the model shape they
// describe, and the optimiser settings both sides of both modes train with.

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

/** AdamW at lr 1e-4, weight decay 0.01, gradients clipped at norm 1.0: flags that
 * `searchr1-trainer sft` and the torch scripts' `train` take alike. */
export const STEP_FLAGS = ["--lr", "1e-4", "--weight-decay", "0.01", "--max-grad-norm", "1.0"];
