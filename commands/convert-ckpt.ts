import { join } from "node:path";
import type { Command } from "commander";
import { outputDType } from "../src/ckpt/cast.js";
import { expectedTensors, verifyTensors } from "../src/ckpt/expected-tensors.js";
import { type FsdpConversion, fsdpToHf, locateFsdp } from "../src/ckpt/fsdp.js";
import { parseShardSize, writeHfFolder } from "../src/ckpt/hf-folder.js";
import { hfFolderTensors } from "../src/ckpt/hf-source.js";
import { megatronToHf } from "../src/ckpt/megatron.js";
import { locateMegatron } from "../src/ckpt/megatron-layout.js";
import { modelDims, readConfig } from "../src/ckpt/model-dims.js";
import { localBaseModel, mergeLora, readLoraAdapter, writeLoraFolder } from "../src/ckpt/peft.js";
import { defineCommand } from "../src/command/define.js";
import { convertCkptSpec } from "../src/config/schemas/convert-ckpt.js";
import { InputError, UsageError } from "../src/runtime/errors.js";
import { withInterrupt } from "../src/runtime/interrupt.js";
import { createProgress, formatBytes } from "../src/runtime/progress.js";
import { table } from "../src/runtime/table.js";

export function register(program: Command): Command {
  return defineCommand(program, {
    spec: convertCkptSpec,
    description:
      "turn Megatron, verl-FSDP and searchr1 checkpoints into Hugging Face safetensors folders",
    aliases: ["convert"],
    positional: { name: "kind", key: "kind", single: true },
    flags: [
      { flags: "--input <dir>", key: "input" },
      { flags: "--out <dir>", key: "out" },
      { flags: "--hf-base <dir>", key: "hf_base" },
      { flags: "--dtype <dtype>", key: "dtype" },
      { flags: "--lora <mode>", key: "lora" },
      { flags: "--max-shard-size <size>", key: "max_shard_size" },
      { flags: "--keep-config", key: "keep_config" },
      { flags: "--verify", key: "verify" },
      { flags: "--overwrite", key: "overwrite" },
      { flags: "--quiet", key: "quiet" },
    ],
    examples: [
      "searchr1 convert megatron-to-hf --input ckpt/actor --hf-base models/Qwen2.5-3B --out hf/step300",
      "searchr1 convert fsdp-to-hf --input checkpoints/nq/global_step_300/actor --out hf/step300 --dtype bf16",
      "searchr1 convert native-to-hf --input runs/sft/model --out hf/sft --max-shard-size 2GB --verify",
      "searchr1 convert peft-to-hf --input runs/nq/global_step_100/adapter --hf-base models/Qwen2.5-0.5B-Instruct --out hf/step100",
      "searchr1 convert fsdp-to-hf --input checkpoints/nq-lora/global_step_300/actor --out hf/step300 --lora separate",
    ],
    run: async (config) => {
      const started = Date.now();
      const maxShardBytes = parseShardSize(config.max_shard_size);
      const progress = createProgress({ quiet: config.quiet });
      const warn = (message: string) => progress.log(`warning: ${message}`);

      if (config.lora !== "merge" && config.kind !== "fsdp-to-hf") {
        throw new UsageError(
          `convert ${config.kind}: --lora ${config.lora} is for fsdp-to-hf (a LoRA run's checkpoint, base and adapters together)`,
        );
      }
      let baseDir: string;
      let open: (dims: ReturnType<typeof modelDims>) => Promise<FsdpConversion>;
      let from: string;
      if (config.kind === "megatron-to-hf") {
        if (!config.hf_base) {
          throw new UsageError(
            "convert megatron-to-hf: --hf-base is required (the HF folder the model started from: config.json, tokenizer)",
          );
        }
        const layout = locateMegatron(config.input);
        baseDir = config.hf_base;
        from = `${layout.iterDir} (tensor-parallel ${layout.tp}, pipeline ${layout.pp})`;
        open = (dims) => megatronToHf(layout, dims);
      } else if (config.kind === "fsdp-to-hf") {
        const layout = locateFsdp(config.input);
        baseDir = config.hf_base ?? join(layout.actorDir, "huggingface");
        from = `${layout.actorDir} (world size ${layout.worldSize})`;
        open = (dims) => fsdpToHf(layout, dims, config.lora);
      } else if (config.kind === "peft-to-hf") {
        const adapter = await readLoraAdapter(config.input);
        const base = config.hf_base ?? localBaseModel(config.input, adapter);
        if (base === null) {
          throw new UsageError(
            `convert peft-to-hf: --hf-base is required (the model the adapter was trained on; the adapter's base_model_name_or_path ${JSON.stringify(adapter.baseModel)} is not a local folder)`,
          );
        }
        baseDir = base;
        from = `${config.input} (LoRA rank ${[...adapter.pairs.values()][0]?.rank ?? 0} on ${adapter.pairs.size} weights, scaling ${adapter.scaling}) merged into ${base}`;
        open = async () => mergeLora(await hfFolderTensors(base), adapter, config.input);
      } else {
        baseDir = config.hf_base ?? config.input;
        from = config.input;
        open = () => hfFolderTensors(config.input);
      }
      const configPath = join(baseDir, "config.json");
      const hfConfig = readConfig(configPath);
      const dims = modelDims(hfConfig, configPath);
      const conversion = await open(dims);
      try {
        const expected = expectedTensors(hfConfig, configPath);
        // The table shows each tensor as it will be written (after --dtype).
        const written = conversion.tensors.map((t) => ({
          ...t,
          dtype: outputDType(t.dtype, config.dtype),
        }));
        const check = verifyTensors(expected, written);
        if (config.verify) {
          process.stdout.write(`${table(check.rows, new Set()).join("\n")}\n`);
        }
        if (check.problems > 0) {
          throw new InputError(
            `${from}: ${check.problems} tensor(s) do not match what ${configPath} implies` +
              (config.verify ? "" : "; --verify prints the table"),
          );
        }
        // The order transformers' save_pretrained writes (expected covers every tensor now).
        const rank = new Map(expected.map((t, i) => [t.name, i]));
        const tensors = [...conversion.tensors].sort(
          (a, b) => (rank.get(a.name) ?? 0) - (rank.get(b.name) ?? 0),
        );
        const { adapter } = conversion;
        const adapterDir = join(config.out, "lora_adapter");
        const summary = await withInterrupt(
          (signal) =>
            writeHfFolder({
              out: config.out,
              baseDir,
              tensors,
              dtype: config.dtype,
              maxShardBytes,
              overwrite: config.overwrite,
              keepConfig: config.keep_config,
              progress,
              signal,
              warn,
              extra: adapter
                ? (dir) =>
                    writeLoraFolder(join(dir, "lora_adapter"), adapter.configPath, adapter.tensors)
                : undefined,
            }),
          `interrupted; ${config.out} was not written`,
        );
        const seconds = ((Date.now() - started) / 1000).toFixed(1);
        process.stdout.write(
          `${config.out}: ${summary.tensors} tensors, ${formatBytes(summary.bytes)} ` +
            `(${summary.dtypes.join(", ")}) in ${summary.files.length} file(s) from ${from} in ${seconds} s\n`,
        );
        if (adapter) {
          process.stdout.write(
            `${adapterDir}: the LoRA adapter apart (rank ${adapter.rank}, ${adapter.tensors.length} tensors, ${adapter.configPath} copied); the weights above are the base's, unmerged\n`,
          );
        }
        for (const c of summary.configDtype) {
          process.stdout.write(
            `${join(config.out, "config.json")}: ${c.field} set to ${c.to} (was ${c.from}) to match the tensors; --keep-config keeps the base model's\n`,
          );
        }
      } finally {
        await conversion.close();
      }
    },
  });
}
