import type { Command } from "commander";
import { defineCommand } from "../src/cli/define.js";
import { convertCkptSpec } from "../src/config/schemas/convert-ckpt.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: convertCkptSpec,
    description:
      "turn Megatron, verl-FSDP and searchr1 checkpoints into Hugging Face safetensors folders",
    aliases: ["convert"],
    flags: [
      { flags: "--from <kind>", key: "from" },
      { flags: "--input <dir>", key: "input" },
      { flags: "--out <dir>", key: "out" },
      { flags: "--base-model <dir>", key: "base_model" },
      { flags: "--dtype <dtype>", key: "dtype" },
    ],
    examples: [
      "searchr1 convert --from megatron --input ckpt/actor/global_step_300 --out hf/step300 --base-model models/Qwen2.5-3B",
    ],
  });
}
