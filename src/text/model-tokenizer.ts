/**
 * A model folder's text side, as transformers' AutoTokenizer loads it: tokenizer.json (the
 * tokenizer), tokenizer_config.json (special tokens) and the chat template. Prompts are
 * rendered and tokenized as `apply_chat_template(messages, add_generation_prompt=...)`
 * renders and tokenizes them: the text, then its ids without added special tokens.
 */
import { InputError } from "../runtime/errors.js";
import { type ChatMessage, type ChatTemplate, findChatTemplate } from "./chat-template.js";
import { type EncodeOptions, TextTokenizer } from "./tokenizer.js";
import { readTokenizerConfig } from "./tokenizer-config.js";

export interface ChatOptions {
  /** Append the opening of an assistant turn (what a prompt to generate from needs). */
  addGenerationPrompt: boolean;
  /** Tool schemas for the template to describe (transformers' `tools=`). */
  tools?: readonly Record<string, unknown>[];
  /** More template variables (transformers' apply_chat_template **kwargs). */
  variables?: Record<string, unknown>;
  /** The clock the template's strftime_now reads (default: now). */
  now?: () => Date;
}

export class ModelTokenizer {
  private constructor(
    /** The model folder. */
    readonly dir: string,
    readonly tokenizer: TextTokenizer,
    /** Named special tokens from tokenizer_config.json (`bos_token`, `eos_token`, ...). */
    readonly specialTokens: Readonly<Record<string, string>>,
    /** The folder's chat template, or null when it has none. */
    readonly chatTemplate: ChatTemplate | null,
  ) {}

  /**
   * Loads the folder's tokenizer.json (required), tokenizer_config.json and chat template
   * (both optional here; rendering a chat without a template is an error). InputErrors name
   * the file that is missing or bad.
   */
  static load(dir: string): ModelTokenizer {
    const tokenizer = TextTokenizer.load(dir);
    const config = readTokenizerConfig(dir);
    return new ModelTokenizer(dir, tokenizer, config.specialTokens, findChatTemplate(dir, config));
  }

  /** `tokenizer.encode(text, add_special_tokens=...)`. */
  encode(text: string, options: EncodeOptions): Promise<number[]> {
    return this.tokenizer.encode(text, options);
  }

  /** `tokenizer.decode(ids, skip_special_tokens=...)`. */
  decode(ids: readonly number[], skipSpecialTokens: boolean): Promise<string> {
    return this.tokenizer.decode(ids, skipSpecialTokens);
  }

  /** `apply_chat_template(messages, tokenize=False, ...)`: the prompt text. */
  applyChatTemplate(messages: readonly ChatMessage[], options: ChatOptions): string {
    if (!this.chatTemplate) {
      throw new InputError(
        `${this.dir}: the model has no chat template (no chat_template.jinja, and no ` +
          `"chat_template" in ${this.dir}/tokenizer_config.json)`,
      );
    }
    return this.chatTemplate.render(messages, { ...options, specialTokens: this.specialTokens });
  }

  /**
   * `apply_chat_template(messages, tokenize=True, ...)`: the prompt's ids (its text encoded
   * without added special tokens: the template writes BOS itself where the model wants it).
   */
  encodeChat(messages: readonly ChatMessage[], options: ChatOptions): Promise<number[]> {
    return this.encode(this.applyChatTemplate(messages, options), { addSpecialTokens: false });
  }
}
