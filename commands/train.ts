import type { Command } from "commander";
import { defineCommand } from "../src/command/define.js";
import { trainSpec } from "../src/config/schemas/train.js";
import { dryRunText } from "../src/planning/dry-run.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress } from "../src/runtime/progress.js";
import { loraLoad } from "../src/train/lora.js";
import { runNode } from "../src/train/nodes.js";
import { runDirOf, runTrain } from "../src/train/run.js";
import { trainView } from "../src/train/view.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: trainSpec,
    description:
      "run GRPO or PPO with multi-turn search rollouts: the native trainer, the engine and the retriever as child processes; metrics, plots, checkpoints, resume",
    flags: [
      { flags: "--model <dir>", key: "model.path" },
      { flags: "--algorithm <name>", key: "algorithm.name" },
      { flags: "--gpus <n>", key: "trainer.gpus" },
      { flags: "--nnodes <n>", key: "trainer.nnodes" },
      { flags: "--node-rank <r>", key: "trainer.node_rank" },
      { flags: "--master-addr <host[:port]>", key: "trainer.master_addr" },
      { flags: "--master-port <port>", key: "trainer.master_port" },
      { flags: "--retriever-url <url>", key: "retriever.url" },
      { flags: "--engine-url <url>", key: "rollout.engine_url" },
      { flags: "--output-dir <dir>", key: "trainer.output_dir" },
      { flags: "--resume <mode>", key: "trainer.resume" },
      { flags: "--dry-run", key: "trainer.dry_run" },
      { flags: "--device-memory <GiB>", key: "trainer.device_memory_gib" },
    ],
    examples: [
      "searchr1 train --config templates/configs/search-r1-v0.2-grpo.yaml --model models/Qwen2.5-3B",
      "searchr1 train --model models/Qwen2.5-3B actor.lr=1e-6 data.train_batch_size=512 rollout.n=5",
      "searchr1 train --config templates/configs/search-r1-v0.2-grpo.yaml --model models/Qwen2.5-3B --gpus 8 --dry-run",
      "searchr1 train --config run.yaml --gpus 8 --nnodes 2 --node-rank 0 --master-addr node0:29500",
      "searchr1 train --config run.yaml --gpus 8 --nnodes 2 --node-rank 1 --master-addr node0:29500",
    ],
    run: async (config) => {
      // The memory plan of one device, then nothing else; of a run the trainer would start:
      // what it refuses beside LoRA adapters (model.lora_*) is refused here too.
      if (config.trainer.dry_run) {
        loraLoad(config);
        process.stdout.write(await dryRunText(config));
        return;
      }
      // Node k > 0 of several: it serves node 0's ranks and replicas until the run is over.
      if (config.trainer.nnodes > 1 && config.trainer.node_rank > 0) {
        const node = config.trainer.node_rank;
        await withInterrupt(
          (signal) => runNode(config, (line) => process.stderr.write(`${line}\n`), signal),
          `interrupted; node ${node} has left the run, which stops on node 0 too`,
        );
        process.stdout.write(`done: node ${node} served the run to its end\n`);
        return;
      }
      const tty = process.stderr.isTTY === true;
      const view = trainView(createProgress(), tty);
      try {
        const { dir, wrote } = await withInterrupt(
          (signal) => runTrain(config, view, signal),
          `interrupted; the checkpoints in ${runDirOf(config)} are intact: run the same command to resume`,
        );
        view.finish();
        process.stdout.write(`done: ${dir}${wrote.length ? ` (${wrote.join(", ")})` : ""}\n`);
      } finally {
        view.finish();
      }
    },
  });
}
