// A model folder for the Hermes format end to end with the real native engine: the tiny
// test model's tokenizer and shape (test/engine/fixtures/qwen-bpe) with a tools-aware chat
// template (fixtures/chatml-tools.jinja, Qwen2.5-Instruct's tool rendering) and weights set
// so that greedy and sampled decoding alike write one search call and end the turn. The
// random tiny models never write a tool call; this one always does, so a run exercises the
// tool turns (retriever, template, masking) for real.
//
// How: one added (non-special) token holds the whole call text, as Qwen2.5's tokenizer holds
// <tool_call> as an added token. Every attention and MLP output weight is zero, so the last
// hidden state is the last token's embedding; the embedding of "\n" (what every prompt and
// every tool turn ends with: `<|im_start|>assistant\n`) and of the call token are two unit
// vectors, and lm_head maps them to the call token and to <|im_end|> with a margin of ~57
// logits: "\n" → call → EOS.
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { type ModelShape, paramSpecs } from "../../src/ckpt/model-shape.js";
import { type NamedTensor, writeSafetensors } from "../../src/tensors/safetensors.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { modelDir } from "../engine/helpers.js";

const BASE = modelDir("qwen-bpe");
const FIXTURES = fileURLToPath(new URL("fixtures/", import.meta.url));
/** The tools-aware template. */
export const TOOLS_TEMPLATE = path.join(FIXTURES, "chatml-tools.jinja");
/** verl's search tool_config (verl examples/sglang_multiturn/config/tool_config/search_tool_config.yaml). */
export const TOOL_CONFIG = fileURLToPath(
  new URL("../text/fixtures/hermes/search_tool_config.yaml", import.meta.url),
);
/** The query the model searches for: the test corpus has a Paul Walker passage. */
export const CALL_QUERY = "paul walker";
/** What the model writes in every turn (then <|im_end|>). */
export const CALL_TEXT = `<tool_call>\n{"name": "search", "arguments": {"query_list": ["${CALL_QUERY}"]}}\n</tool_call>`;

/** Writes the model folder into `dir` (an empty folder); returns `dir`. */
export async function writeHermesModel(dir: string): Promise<string> {
  const config = JSON.parse(readFileSync(path.join(BASE, "config.json"), "utf8"));
  const call = config.vocab_size as number; // the added token's id: the first free one
  const eos = config.eos_token_id as number;
  config.vocab_size = call + 1;
  writeFileSync(path.join(dir, "config.json"), `${JSON.stringify(config, null, 2)}\n`);
  copyFileSync(path.join(BASE, "generation_config.json"), path.join(dir, "generation_config.json"));
  copyFileSync(TOOLS_TEMPLATE, path.join(dir, "chat_template.jinja"));

  const added = {
    content: CALL_TEXT,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: false,
  };
  const tokenizer = JSON.parse(readFileSync(path.join(BASE, "tokenizer.json"), "utf8"));
  tokenizer.added_tokens.push({ id: call, ...added });
  writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  const tokConfig = JSON.parse(readFileSync(path.join(BASE, "tokenizer_config.json"), "utf8"));
  const { content, ...flags } = added;
  tokConfig.added_tokens_decoder[String(call)] = { content, ...flags };
  delete tokConfig.chat_template; // chat_template.jinja is the template
  writeFileSync(path.join(dir, "tokenizer_config.json"), `${JSON.stringify(tokConfig, null, 2)}\n`);

  const newline = TextTokenizer.load(dir).tokenToId("\u010a"); // byte-level "\n"
  if (newline === null) throw new Error(`${BASE}: no "\\n" token`);
  const shape: ModelShape = {
    vocab: config.vocab_size,
    hidden: config.hidden_size,
    intermediate: config.intermediate_size,
    layers: config.num_hidden_layers,
    heads: config.num_attention_heads,
    kvHeads: config.num_key_value_heads,
    headDim: config.hidden_size / config.num_attention_heads,
    tied: config.tie_word_embeddings,
    attentionBias: true,
  };
  const h = shape.hidden;
  const tensors: NamedTensor[] = paramSpecs(shape).map(([name, dims, kind]) => {
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    if (kind === "norm") data.fill(1);
    if (name === "model.embed_tokens.weight") {
      data[newline * h + 0] = 1;
      data[call * h + 1] = 1;
    }
    if (name === "lm_head.weight") {
      data[call * h + 0] = 10; // "\n" → the call
      data[eos * h + 1] = 10; // the call → <|im_end|>
    }
    return { name, dtype: "F32", shape: dims, data };
  });
  await writeSafetensors(path.join(dir, "model.safetensors"), tensors, { format: "pt" });
  return dir;
}
