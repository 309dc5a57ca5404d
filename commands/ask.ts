import type { Command } from "commander";
import { ask, formatTurn } from "../src/agent/ask.js";
import { defineCommand } from "../src/command/define.js";
import { askSpec } from "../src/config/schemas/ask.js";
import { withInterrupt } from "../src/runtime/interrupt.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: askSpec,
    description:
      "answer one question with the search agent, showing each turn: reasoning, query, documents, answer",
    positional: { name: "question", key: "question", single: true },
    flags: [
      { flags: "--model <dir>", key: "model.path" },
      { flags: "--lora <dir>", key: "model.lora_adapter_path" },
      { flags: "--retriever-url <url>", key: "retriever.url" },
      { flags: "--engine <kind>", key: "rollout.engine" },
      { flags: "--engine-url <url>", key: "rollout.engine_url" },
      { flags: "--template <name|file>", key: "template" },
      { flags: "--sample", key: "rollout.do_sample" },
      { flags: "--json", key: "json" },
    ],
    examples: [
      'searchr1 ask "Who wrote the novel that the film Blade Runner is based on?" --model checkpoints/searchr1/nq_hotpotqa-ppo/global_step_500/hf',
      'searchr1 ask "In which country was Zorvak born?" --model quickstart/trained --retriever-url http://127.0.0.1:8000/retrieve --json',
      'searchr1 ask "what is the capital of Peru" --model models/Qwen2.5-3B --engine-url http://127.0.0.1:30000 --sample rollout.temperature=0.7',
    ],
    run: async (config) => {
      const color = process.stdout.isTTY === true && !process.env.NO_COLOR;
      const result = await withInterrupt(
        (signal) =>
          ask(
            config,
            (turn, index) => {
              if (!config.json) process.stdout.write(`${formatTurn(turn, index, color)}\n`);
            },
            (line) => process.stderr.write(`${line}\n`),
            signal,
          ),
        "interrupted",
      );
      if (config.json) {
        process.stdout.write(`${JSON.stringify(result)}\n`);
      } else if (result.answer === null) {
        process.stdout.write(`no answer after ${result.turns.length} turns\n`);
      }
    },
  });
}
