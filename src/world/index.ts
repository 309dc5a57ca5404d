/**
 * The tiny invented world of the quickstart: `writeWorld` writes the corpus, the questions
 * (FlashRAG layout) and the model folder (tokenizer + random Qwen2 weights); after
 * `searchr1 build-index` over its corpus, `writeDemonstrations` writes the SFT warm-start
 * data from real BM25 results.
 */
export {
  buildDemonstrations,
  DEFAULT_DEMONSTRATIONS,
  DEMONSTRATION_FILES,
  type Demonstration,
  type DemonstrationKind,
  type DemonstrationOptions,
  type DemonstrationSummary,
  writeDemonstrations,
} from "./demonstrations.js";
export { DEFAULT_SIZES, type WorldFacts, type WorldSizes } from "./facts.js";
export { DEFAULT_MODEL, type TinyModelOptions } from "./model.js";
export { DATA_SOURCES, type DataSource, type WorldQuestion } from "./questions.js";
export { openIndexSearch, type PassageSearch } from "./search.js";
export {
  DEFAULT_WORLD,
  readWorld,
  WORLD_FILES,
  type WorldFile,
  type WorldOptions,
  type WorldSummary,
  writeWorld,
} from "./world.js";
