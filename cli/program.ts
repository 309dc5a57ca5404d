import { Command } from "commander";
import { register as ask } from "../commands/ask.js";
import { register as buildIndex } from "../commands/build-index.js";
import { register as config } from "../commands/config.js";
import { register as convertCkpt } from "../commands/convert-ckpt.js";
import { register as download } from "../commands/download.js";
import { register as evaluate } from "../commands/eval.js";
import { register as preprocess } from "../commands/preprocess.js";
import { register as quickstart } from "../commands/quickstart.js";
import { register as serveEngine } from "../commands/serve-engine.js";
import { register as serveRetriever } from "../commands/serve-retriever.js";
import { register as train } from "../commands/train.js";
import { packageVersion } from "../src/runtime/package-root.js";

/** The searchr1 command tree, in pipeline order. */
export function buildProgram(): Command {
  const program = new Command("searchr1")
    .description(
      "Train language models to reason and call a search engine with RL (the Search-R1 recipe).",
    )
    .version(packageVersion(), "-V, --version")
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride();
  for (const register of [
    quickstart,
    download,
    preprocess,
    buildIndex,
    serveRetriever,
    serveEngine,
    train,
    evaluate,
    ask,
    convertCkpt,
    config,
  ]) {
    register(program).exitOverride();
  }
  return program;
}
