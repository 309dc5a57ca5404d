import type { CommandConfigSpec } from "./resolve.js";
import { askSpec } from "./schemas/ask.js";
import { buildIndexSpec } from "./schemas/build-index.js";
import { convertCkptSpec } from "./schemas/convert-ckpt.js";
import { downloadSpec } from "./schemas/download.js";
import { evalSpec } from "./schemas/eval.js";
import { preprocessSpec } from "./schemas/preprocess.js";
import { quickstartSpec } from "./schemas/quickstart.js";
import { serveEngineSpec } from "./schemas/serve-engine.js";
import { serveRetrieverSpec } from "./schemas/serve-retriever.js";
import { trainSpec } from "./schemas/train.js";

/** Every command's config spec, for `searchr1 config <command>`. */
export const CONFIG_SPECS: Record<string, CommandConfigSpec> = Object.fromEntries(
  [
    quickstartSpec,
    downloadSpec,
    preprocessSpec,
    buildIndexSpec,
    serveRetrieverSpec,
    serveEngineSpec,
    trainSpec,
    evalSpec,
    askSpec,
    convertCkptSpec,
  ].map((s) => [s.command, s as CommandConfigSpec]),
);
