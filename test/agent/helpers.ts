import { TextTokenizer } from "../../src/text/tokenizer.js";
import { modelDir } from "../engine/helpers.js";

/** The tiny Qwen-style model (ChatML template, byte-level BPE) the agent tests run on. */
export const AGENT_MODEL = modelDir("qwen-bpe");
export const agentTokenizer = TextTokenizer.load(AGENT_MODEL);
/** `<|im_end|>`: the model's EOS. */
export const EOS = agentTokenizer.tokenToId("<|im_end|>") as number;
