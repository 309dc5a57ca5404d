"""Generate the reference fixtures of the inference engine's tests (issue 16).

Run from anywhere with a Python that has torch, transformers (5.x), tokenizers and
safetensors (CPU only, no network):

    /work/venv/bin/python test/engine/make_fixtures.py

It (re)writes, under test/engine/fixtures/:

  qwen-bpe/     tiny Qwen2 (3 layers, hidden 32, 4 heads of 8, 2 KV heads, intermediate
                64, untied, rope_parameters.rope_theta 1e6, max_position_embeddings 512),
                float32 model.safetensors and config.json as transformers 5's
                save_pretrained writes them; a byte-level BPE tokenizer.json trained here
                with `tokenizers` (Qwen2's pipeline: NFC, the Qwen2 split regex, ByteLevel
                pre-tokenizer/decoder/post-processor, 448 regular tokens, then the specials
                <|endoftext|> 448, <|im_start|> 449, <|im_end|> 450; vocab_size 451 = the
                tokenizer's size, no padding); tokenizer_config.json with Qwen2's ChatML
                chat_template; generation_config.json with eos_token_id [450, 448].
  llama-sp/     tiny Llama (2 layers, same widths, no attention bias, untied, rope_theta
                1e4) with a SentencePiece-style tokenizer.json as transformers 5's
                LlamaTokenizer builds it: Metaspace pre-tokenizer ("▁", prepend_scheme
                "first", no split), BPE with byte_fallback, <unk> 0, <s> 1, </s> 2, the
                byte tokens <0x00>..<0xFF> 3..258, then the trained pieces; decoder
                Replace("▁"," ") + ByteFallback + Fuse + Strip(1 leading space).
                generation_config eos_token_id 2 (</s>).
  tiny-vocab/   Qwen2 with vocab_size 16 (2 layers, hidden 32) and a 16-token WordLevel
                tokenizer.json (<|endoftext|> = 0 = eos; no decoder, so decode joins words
                with spaces), whose next-token distribution after SAMPLING_PROMPT is spread
                out (max < 0.4, at least 3 below 0.02, at least 6 above 0.05): the first
                seed from 3003 and lm_head scale (0.1 steps) for which this holds and every
                setting below qualifies.
  qwen-hd16/    the CUDA engine test's Qwen2 (test/engine/cuda.test.ts): 3 layers, hidden
                32, 2 heads of 16, 1 KV head (GQA), intermediate 64, attention bias,
                rope_theta 1e6, qwen-bpe's tokenizer and generation_config. Weights of
                std CUDA_INIT_STD (see "CUDA models" below).
  llama-hd64/   the CUDA engine test's Llama: 2 layers, hidden 32, 2 heads of 64
                (config head_dim 64: q_dim 128 > hidden, each lane of the paged attention
                kernel holds 2 dimensions), 1 KV head, no bias, rope_theta 1e4, llama-sp's
                tokenizer and generation_config.
  greedy.json   {"max_new_tokens", "cases": [{model, name, prompt_ids, output_ids,
                logprobs, eos_at, text, min_margin}]}: greedy continuations of 24 tokens
                for the four models (qwen-hd16 and llama-hd64 have the prompts of
                qwen-bpe and llama-sp), prompts of 1, 5, 17, 33, 45 and 70 tokens plus
                (qwen-bpe, qwen-hd16) a 64-token ChatML prompt "chat"; llama-sp prompts
                start with <s> ("len1" is <s> alone); "len17" is a prefix of "len33" and
                "len45", which share a 32-token prefix and differ at token 33. output_ids
                do NOT stop at EOS (the engine test uses ignore_eos); eos_at is the index
                in output_ids of the first EOS token (generation_config's eos_token_id),
                null if none. logprobs[i] = log_softmax(logits)[output_ids[i]] in float32
                (no temperature). text = decode(output_ids, skip_special_tokens=True).
                min_margin = the smallest gap between the top two float32 logits over the
                24 steps (how robust the argmax is to a different summation order).
  sampling.json {"model", "prompt_ids", "logits", "settings": [{name, temperature, top_k,
                top_p, min_p, probs, logprobs, kept}]} for tiny-vocab.
  decode.json   {"qwen-bpe"|"llama-sp": {"decode": [{name, ids, text_skip_special,
                text_keep_special}], "incremental": {ids, text_skip_special: [...],
                text_keep_special: [...]}, "encode": [{text, ids}]}}.
  stop.json     {"model", "source_case", "prompt_ids", "max_new_tokens", "cases": [{name,
                stop, output_ids, text, text_no_trim, matched_at}]} for qwen-bpe.

Sampling rule (SGLang's top_k_top_p_min_p_sampling_from_probs_torch), for one setting:
  probs   = softmax(logits / T)                       (float64 from the float32 logits)
  sort probs descending (p_0 >= p_1 >= ...), cum_before_r = p_0 + ... + p_{r-1}
  zero rank r when r >= top_k                         (top_k = -1: off)
  zero rank r when cum_before_r > top_p               (the smallest prefix with mass >= top_p
                                                       stays; cumulative sums are taken
                                                       before any zeroing)
  zero token when p < min_p * p_0                     (min_p = 0: off)
  renormalise the survivors to sum 1                  -> "probs"
  "logprobs" = log_softmax(logits / T), unprocessed: what the engine reports for the
  sampled token. "kept" = number of nonzero probs. The settings are chosen so that each
  rule changes the distribution (total variation >= 0.05 from softmax(logits / T)); no
  cumulative mass or probability lies within 1e-3 of a threshold.

Stop strings (SGLang semantics): generation ends at the first token whose decoded output
(decode(output_ids[:k+1]), skip_special_tokens=True) contains the stop string; output_ids
keep that token; text = that decoded output cut before the first occurrence of the stop
string (text_no_trim = uncut). The stop strings are picked from the greedy continuation of
the first qwen-bpe case of greedy.json, in the order STOP_ORDER, that gives both picks below
before any EOS and without U+FFFD in the text ("source_case"):
  "across" = the last 2 characters of the text before token k + the first character of
             token k, for the first token k (k >= 2) that adds at least 2 ASCII characters
             and whose pick does not occur earlier: the string starts in an earlier token
             and is completed in the middle of token k;
  "inside" = the first 2 characters of the first later token that adds at least 3 ASCII
             characters and whose pick does not occur earlier: it is completed inside one
             token.

Weights: normal(0, INIT_STD) for matrices, embeddings and biases, 1 + normal(0, 0.1) for
RMSNorm weights, from a fixed torch.Generator; INIT_STD = 0.4 makes greedy continuations
varied (checked: at least 10 distinct tokens of 24 in every case). The lm_head rows of
lone-byte tokens (non-printable or non-ASCII single bytes) are scaled by BYTE_ROW_SCALE so
continuations read more like text. The lm_head row of the first EOS id is then scaled by the
first factor of EOS_BOOST that makes EOS the greedy pick in some (at most half) of the
cases, so eos_at is exercised; every greedy step must have a top-2 logit gap > MIN_MARGIN.
Seeds are tried in a fixed order until all of this holds.

CUDA models: on CUDA the engine is bf16 and supports head_dim 16, 32, 64 and 128 (the
trainer's attention kernels; native/src/backend/cuda/cuda_backend.cu), so qwen-bpe and
llama-sp (head_dim 8) are refused there. Their weights of std 0.4 also make them too
sensitive to bf16 for the test's tolerances: test/engine/bf16_tolerance.py, which emulates
the engine's bf16 arithmetic, measures max |d lp| / (1 + |lp|) of 0.17 and 0.08 on them
against 4e-2 allowed (and as much at head_dim 16 or 64 with the same std). qwen-hd16 and
llama-hd64 use weights of std CUDA_INIT_STD = 0.2, no EOS boost, and the first seed (from
4001 and 5001) whose greedy continuations are varied with every margin > MIN_MARGIN and
whose emulated bf16 error is at most CUDA_BF16_MAX_REL per token and CUDA_BF16_MAX_L2 in L2,
the errors the trainer's bf16 tolerance was measured at (test/native/bf16_tolerance.py:
1.2e-2 and 5e-3), so cuda.test.ts's tolerances (4e-2, 2e-2) keep their 3-4x margin.

Self-checks (the script fails loudly otherwise): the saved folders reload with
transformers (weights bit-exact, config as intended) and with AutoTokenizer (same decode and
encode results as the raw `tokenizers` file, same chat template rendering); greedy outputs
are reproduced by the reloaded model (tokens exactly, log-probs to RELOAD_TOL: with torch
2.13 the reloaded copy of the same weights differs from the model built here in the last
fp32 bits, about 3e-6) and equal transformers' generate(do_sample=False) with a KV cache
(tokens exactly, logprobs to 1e-4; measured about 2e-5) and the float64 model's argmax
path, with the float32-float64 logprob differences reported (about 1e-5); the CUDA models'
emulated bf16 error is within its bounds; sampling probabilities are recomputed by an
independent pure-Python implementation; every stop case is verified by decoding each
prefix; each model folder is < 300 KB; and, when node_modules/.bin/biome exists and
biome.json does not exclude the fixtures, the JSON files are already in biome's format.
Output is deterministic: rerunning with the same torch build gives byte-identical files
(sha256 printed in the summary); another build changes the float32 log-probs and logits
in their last bits, not the weights, tokenizers or tokens.
"""

import copy
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import unicodedata

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers: frugal and deterministic
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers.models import BPE, WordLevel  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

torch.set_num_threads(1)  # frugal, and a fixed reduction order -> byte-identical reruns

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
REPO = os.path.dirname(os.path.dirname(HERE))

# The emulation of the CUDA engine's bf16 arithmetic (numpy), loaded by path.
_spec = importlib.util.spec_from_file_location("engine_bf16_tolerance",
                                               os.path.join(HERE, "bf16_tolerance.py"))
bf16_tolerance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf16_tolerance)

MAX_NEW_TOKENS = 24
INIT_STD, NORM_STD = 0.4, 0.1
EOS_BOOST = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0, 2.5, 3.0]
FOLDER_LIMIT = 300 * 1024
BYTE_ROW_SCALE = 0.5  # lone-byte tokens are rarer picks: more readable continuations
MIN_MARGIN = 1e-3  # smallest accepted gap between the top two float32 logits
RELOAD_TOL = 1e-5  # reloaded model's greedy log-probs against the ones written
# The CUDA engine test's models (see "CUDA models" in the docstring).
CUDA_INIT_STD = 0.2
CUDA_BF16_MAX_REL, CUDA_BF16_MAX_L2 = 1.2e-2, 5e-3

# Built-in training text: Search-R1's prompt vocabulary, plus French (2-byte UTF-8),
# Chinese (3-byte) and emoji (4-byte) so that byte-level tokens split characters.
CORPUS = """\
Question: who wrote the answer? You must reason inside <think> and </think> first every \
time you get new information. After reasoning, if you find you lack some knowledge, you can \
call a search engine by <search> query </search> and it will return the top searched results \
between <information> and </information>. You can search as many times as you want. If you \
find no further external knowledge needed, you can directly provide the answer inside \
<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>.
The search engine returns information about the question. The answer is in the information. \
A good search query names the thing you want to know. The model reads the documents, thinks \
about the question, and writes the answer. Searching again helps when the first results do \
not contain the answer.
Doc 1(Title: "Information retrieval") Information retrieval is the task of finding documents \
that answer a question. Doc 2(Title: "Search engine") A search engine ranks documents by how \
well they match the query. Doc 3(Title: "Question answering") Question answering systems \
search for information and return a short answer.
Le café est très élégant, à côté de l'école. Où est la bibliothèque? Déjà vu, naïve façade, \
crème brûlée.
中文搜索引擎可以回答问题。我们搜索信息，然后回答。中文信息检索。问题和答案。
Emoji: 🔍 search, 📚 books, 🤖 model, ✨ answer! 🔍📚
"""

# Prompt texts (token prefixes of their encodings are used, see greedy_prompts).
PROMPT_BASE = (
    "Answer the question. You can search for information with a search engine, and the "
    "documents will be returned between information tags before you answer."
)
PROMPT_OTHER = " The search results say that the answer is in the first document."
PROMPT_SHORT = "Who wrote the first search engine?"
PROMPT_LONG = (
    "Doc 1(Title: \"Café\") Le café est très élégant. 中文搜索 🔍 Doc 2(Title: \"Search\") "
    "A search engine ranks documents by how well they match the query, and the model "
    "writes the answer inside answer tags."
)
CHAT_QUESTION = "Who wrote the first search engine? Search for information, then answer."

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2-Instruct's ChatML template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_WORDS = [
    "<|endoftext|>", "the", "a", "search", "answer", "is", "of", "in",
    "to", "and", "red", "blue", "green", "cat", "dog", ".",
]
SAMPLING_PROMPT = "the cat is in the"
SAMPLING_SETTINGS = [
    # name, temperature, top_k, top_p, min_p
    ("plain", 1.0, -1, 1.0, 0.0),
    ("temperature_0.7", 0.7, -1, 1.0, 0.0),
    ("top_k_5", 1.0, 5, 1.0, 0.0),
    ("top_p_0.8", 1.0, -1, 0.8, 0.0),
    ("min_p_0.1", 1.0, -1, 1.0, 0.1),
    ("top_k_8_top_p_0.9_t_1.3", 1.3, 8, 0.9, 0.0),
    ("top_p_0.95_min_p_0.05_t_0.8", 0.8, -1, 0.95, 0.05),
]

SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}


# ---------------------------------------------------------------------------
# JSON in the repository's (biome's) format
# ---------------------------------------------------------------------------

LINE_WIDTH = 100


def text_width(s):
    """Columns a string takes (East Asian wide/fullwidth characters count 2)."""
    w = 0
    for ch in s:
        if unicodedata.combining(ch):
            continue
        w += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return w


def scalar(v):
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        assert math.isfinite(v), v
        return re.sub(r"e([+-]?)0*(\d)", r"e\1\2", repr(v)).replace("e+", "e")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(type(v))


def flat(v):
    """One-line form, or None when the value must span lines (non-empty objects)."""
    if isinstance(v, dict):
        return "{}" if not v else None
    if isinstance(v, list):
        parts = [flat(x) for x in v]
        return None if any(p is None for p in parts) else "[" + ", ".join(parts) + "]"
    return scalar(v)


def fmt(v, indent, head, tail):
    """Lines of `v` printed after `head` (indent + key) and followed by `tail` (a comma or
    nothing), as biome formats JSON: objects one member per line (kept expanded), arrays
    on one line when they fit in LINE_WIDTH, else numbers packed (fill) and anything else
    one element per line."""
    pad = "  " * indent
    one = flat(v)
    if one is not None and text_width(head + one + tail) <= LINE_WIDTH:
        return [head + one + tail]
    if not isinstance(v, (dict, list)):
        return [head + one + tail]  # a long string stays on its line
    inner = "  " * (indent + 1)
    if isinstance(v, dict):
        lines = [head + "{"]
        keys = list(v)
        for i, k in enumerate(keys):
            sep = "," if i < len(keys) - 1 else ""
            lines += fmt(v[k], indent + 1, inner + scalar(k) + ": ", sep)
        return lines + [pad + "}" + tail]
    assert isinstance(v, list), v
    lines = [head + "["]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    if numeric:
        cur = None
        for i, x in enumerate(v):
            item = scalar(x) + ("," if i < len(v) - 1 else "")
            if cur is not None and text_width(cur + " " + item) <= LINE_WIDTH:
                cur += " " + item
            else:
                if cur is not None:
                    lines.append(cur)
                cur = inner + item
        lines.append(cur)
    else:
        for i, x in enumerate(v):
            lines += fmt(x, indent + 1, inner, "," if i < len(v) - 1 else "")
    return lines + [pad + "]" + tail]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(fmt(obj, 0, "", "")) + "\n")


def reformat_json(path):
    """Rewrite a JSON file written by transformers/tokenizers in the repository's format
    (same content, keys in the same order)."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    write_json(path, obj)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------

def corpus_lines():
    return [line for line in CORPUS.splitlines() if line]


def build_qwen_tokenizer():
    """Byte-level BPE with Qwen2's pipeline (as transformers' Qwen2Tokenizer builds it)."""
    tok = Tokenizer(
        BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    trainer = trainers.BpeTrainer(
        vocab_size=448,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    assert tok.get_vocab_size() == 448, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    return tok


def build_llama_tokenizer():
    """SentencePiece-style BPE with byte fallback (as transformers' LlamaTokenizer builds it).

    The pieces are trained on the corpus lines without CJK or emoji, so those characters
    fall back to <0xXX> byte tokens."""
    trainer_tok = Tokenizer(BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="always", split=True
    )
    lines = [ln for ln in corpus_lines() if not any(ord(c) > 0x2FFF for c in ln)]
    trainer = trainers.BpeTrainer(
        vocab_size=160, min_frequency=2, show_progress=False, limit_alphabet=70
    )
    trainer_tok.train_from_iterator(lines, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        assert piece not in vocab, piece
        vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(
        BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ["<unk>", "<s>", "</s>"]]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def build_tiny_tokenizer():
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(TINY_WORDS)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def added_tokens_decoder(tok):
    out = {}
    for tid, tok_ in sorted(tok.get_added_tokens_decoder().items()):
        out[str(tid)] = {
            "content": tok_.content,
            "lstrip": tok_.lstrip,
            "normalized": tok_.normalized,
            "rstrip": tok_.rstrip,
            "single_word": tok_.single_word,
            "special": tok_.special,
        }
    return out


def write_tokenizer(mdir, tok, tokenizer_config):
    path = os.path.join(mdir, "tokenizer.json")
    tok.save(path, pretty=False)
    reformat_json(path)
    write_json(os.path.join(mdir, "tokenizer_config.json"), tokenizer_config)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

def init_weights(model, seed, std=INIT_STD):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + NORM_STD * r if name.endswith("norm.weight") else std * r)


def bytes_to_unicode():
    """GPT-2's byte -> printable character table used by ByteLevel."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def lone_byte_ids(tok):
    """Ids of tokens that stand for one byte outside printable ASCII: ByteLevel characters
    of such bytes (Qwen) or <0xXX> byte-fallback tokens (Llama)."""
    vocab = tok.get_vocab()
    table = bytes_to_unicode()
    ids = [vocab[table[b]] for b in range(256) if not 0x20 <= b <= 0x7E and table[b] in vocab]
    ids += [vocab[f"<0x{b:02X}>"] for b in range(256) if f"<0x{b:02X}>" in vocab]
    return sorted(ids)


def save_model(mdir, model, generation_config):
    model.generation_config = generation_config
    model.save_pretrained(mdir)
    for name in ("config.json", "generation_config.json"):
        reformat_json(os.path.join(mdir, name))
    extra = set(os.listdir(mdir)) - {"config.json", "generation_config.json", "model.safetensors"}
    assert not extra, f"save_pretrained wrote unexpected files: {extra}"


def eos_ids(model):
    e = model.generation_config.eos_token_id
    return [e] if isinstance(e, int) else list(e)


# ---------------------------------------------------------------------------
# Greedy references
# ---------------------------------------------------------------------------

@torch.no_grad()
def greedy_loop(model, prompt, n):
    """Greedy decode recomputing the full context every step, float32."""
    ids, out, lps, margin = list(prompt), [], [], math.inf
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        margin = min(margin, float(top.values[0] - top.values[1]))
        out.append(nxt)
        lps.append(float(torch.log_softmax(logits, -1)[nxt]))
        ids.append(nxt)
    return out, lps, margin


@torch.no_grad()
def greedy_generate(model, prompt, n):
    """transformers' generate (KV cache), ignoring EOS; returns (ids, logprobs)."""
    x = torch.tensor([prompt])
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # else generate() merges it back in
    try:
        r = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
    finally:
        model.generation_config.eos_token_id = saved
    out = r.sequences[0, len(prompt) :].tolist()
    lps = [float(torch.log_softmax(lg[0].float(), -1)[t]) for lg, t in zip(r.logits, out)]
    return out, lps


@torch.no_grad()
def float64_check(model, prompt, out, lps):
    """Full-context float64 forward: argmax path and max |logprob32 - logprob64|."""
    m64 = copy.deepcopy(model).double()
    logits = m64(torch.tensor([list(prompt) + list(out)])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    worst = 0.0
    for i, t in enumerate(out):
        row = logp[len(prompt) - 1 + i]
        assert int(row.argmax()) == t, "float64 argmax differs from the float32 greedy path"
        worst = max(worst, abs(float(row[t]) - lps[i]))
    return worst


def greedy_prompts(encode, bos):
    """(name, ids) with lengths 1, 5, 17, 33, 45 and 70 (token prefixes of encoded text).
    bos: the id put first (Llama's <s>) or None."""
    head = [bos] if bos is not None else []
    base = head + encode(PROMPT_BASE + PROMPT_OTHER)
    assert len(base) >= 33, len(base)
    shared = base[:32]
    other = encode(" Here is what the documents say about the search engine and its answer.")
    long_ids = head + encode(PROMPT_LONG)
    assert len(long_ids) >= 70, len(long_ids)
    prompts = [
        ("len1", head[:1] or encode("The")[:1]),
        ("len5", (head + encode(PROMPT_SHORT))[:5]),
        ("len17", shared[:17]),
        ("len33", base[:33]),
        ("len45", shared + other[:13]),
        ("len70", long_ids[:70]),
    ]
    lens = {n: len(p) for n, p in prompts}
    assert lens == {"len1": 1, "len5": 5, "len17": 17, "len33": 33, "len45": 45, "len70": 70}
    assert prompts[3][1][32] != prompts[4][1][32], "len33 and len45 must differ at token 33"
    return prompts


def greedy_cases(name, model, prompts):
    cases = []
    for pname, prompt in prompts:
        out, lps, margin = greedy_loop(model, prompt, MAX_NEW_TOKENS)
        eos = eos_ids(model)
        eos_at = next((i for i, t in enumerate(out) if t in eos), None)
        cases.append(
            {
                "model": name,
                "name": pname,
                "prompt_ids": list(prompt),
                "output_ids": out,
                "logprobs": lps,
                "eos_at": eos_at,
                "min_margin": margin,
            }
        )
    return cases


def varied(out):
    return len(set(out)) >= 10


def boosted_cases(name, model, prompts, seeds, damped):
    """Initialise with the first seed of `seeds`, scale the lm_head rows of `damped` (lone
    non-ASCII/control bytes) by BYTE_ROW_SCALE, then scale the lm_head row of the first
    EOS id by the first factor of EOS_BOOST that makes EOS the greedy pick in some (at most
    half) of the cases, one of them at step 2..20, with every top-2 logit gap above
    MIN_MARGIN; else the next seed. Returns (cases, seed, factor)."""
    eos = eos_ids(model)[0]
    for seed in seeds:
        init_weights(model, seed)
        with torch.no_grad():
            model.lm_head.weight[damped] *= BYTE_ROW_SCALE
        row = model.lm_head.weight[eos].detach().clone()
        for factor in EOS_BOOST:
            with torch.no_grad():
                model.lm_head.weight[eos] = row * factor
            cases = greedy_cases(name, model, prompts)
            hits = [c for c in cases if c["eos_at"] is not None]
            margin = min(c["min_margin"] for c in cases)
            print(f"  {name}: seed {seed}, EOS boost x{factor}: eos_at "
                  f"{[c['eos_at'] for c in cases]}, min margin {margin:.2e}")
            if (
                margin <= MIN_MARGIN
                or len(hits) > len(cases) // 2
                or not all(varied(c["output_ids"]) for c in cases)
            ):
                break  # larger factors only add EOS hits; otherwise: next seed
            if any(2 <= c["eos_at"] <= 20 for c in hits):
                return cases, seed, factor
    raise AssertionError(f"{name}: no seed in {seeds} and factor in {EOS_BOOST} fits")


# ---------------------------------------------------------------------------
# Sampling reference
# ---------------------------------------------------------------------------

def sglang_probs(logits, temperature, top_k, top_p, min_p):
    """The rule in the docstring, float64 torch. Returns (probs, logprobs, margins)."""
    z = logits.double() / temperature
    probs = torch.softmax(z, -1)
    logprobs = torch.log_softmax(z, -1)
    p_sort, idx = probs.sort(descending=True)
    cum_before = torch.cumsum(p_sort, -1) - p_sort
    ranks = torch.arange(p_sort.numel())
    keep = torch.ones_like(p_sort, dtype=torch.bool)
    if top_k != -1:
        keep &= ranks < top_k
    keep &= ~(cum_before > top_p)
    keep &= ~(p_sort < min_p * p_sort[0])
    kept = torch.where(keep, p_sort, torch.zeros_like(p_sort))
    out = torch.zeros_like(probs)
    out[idx] = kept / kept.sum()
    margins = []
    if top_p < 1.0:
        margins.append(float((cum_before - top_p).abs().min()))
    if min_p > 0.0:
        margins.append(float(((p_sort - min_p * p_sort[0]) / p_sort[0]).abs().min()))
    return out, logprobs, margins


def python_probs(logits, temperature, top_k, top_p, min_p):
    """Independent pure-Python version of the same rule (for the self-check)."""
    z = [x / temperature for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    p = [x / s for x in e]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    kept, before = {}, 0.0
    for r, i in enumerate(order):
        ok = (top_k == -1 or r < top_k) and before <= top_p and p[i] >= min_p * p[order[0]]
        if ok:
            kept[i] = p[i]
        before += p[i]
    total = sum(kept.values())
    return [kept.get(i, 0.0) / total for i in range(len(p))]


def spread_ok(probs):
    p = sorted(probs.tolist(), reverse=True)
    return p[0] <= 0.4 and sum(1 for x in p if x < 0.02) >= 3 and sum(1 for x in p if x > 0.05) >= 6


def settings_ok(logits):
    for _, t, k, tp, mp in SAMPLING_SETTINGS:
        probs, _, margins = sglang_probs(logits, t, k, tp, mp)
        plain = torch.softmax(logits.double() / t, -1)
        kept = int((probs > 0).sum())
        tv = 0.5 * float((probs - plain).abs().sum())
        if (k != -1 or tp < 1 or mp > 0) and tv < 0.05:
            return False  # the rule must change the distribution measurably
        if kept < 3 or any(m < 1e-3 for m in margins):
            return False
        if k == -1 and tp == 1 and mp == 0:
            assert torch.allclose(probs, plain)
    return True


# ---------------------------------------------------------------------------
# Decode / stop references
# ---------------------------------------------------------------------------

def dec(tok, ids, skip):
    return tok.decode(ids, skip_special_tokens=skip)


def decode_entry(tok, name, ids):
    return {
        "name": name,
        "ids": list(ids),
        "text_skip_special": dec(tok, ids, True),
        "text_keep_special": dec(tok, ids, False),
    }


def mid_char_cut(tok, ids):
    """Smallest k such that decode(ids[:k]) ends inside a multi-byte character (it ends in
    U+FFFD while the full text has no U+FFFD at that place)."""
    full = dec(tok, ids, False)
    assert "\ufffd" not in full
    for k in range(1, len(ids)):
        if dec(tok, ids[:k], False).endswith("\ufffd"):
            return k
    raise AssertionError("no prefix ends inside a multi-byte character")


def decode_fixture(tok, specials, byte_fallback):
    """specials: (start, end) special ids put around the "specials" and "incremental" lists;
    byte_fallback: add cases of lone <0xXX> tokens (Llama)."""
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    plain = enc("The search engine returns information.")
    multi = enc("Le café 中文搜索 🔍 answer: déjà vu ✨")
    cut = mid_char_cut(tok, multi)
    start, end = specials
    cases = [
        decode_entry(tok, "empty", []),
        decode_entry(tok, "plain", plain),
        decode_entry(tok, "suffix_mid_sentence", plain[2:]),
        decode_entry(tok, "multibyte", multi),
        decode_entry(tok, "multibyte_cut_mid_char", multi[:cut]),
        decode_entry(tok, "multibyte_from_mid_char", multi[cut:]),
        decode_entry(tok, "specials", [start] + plain + [end]),
        decode_entry(tok, "special_only", [end]),
        decode_entry(tok, "spaces_newlines", enc("  two  spaces\nand\n\nnewlines ")),
    ]
    if byte_fallback:
        cases.append(decode_entry(tok, "bytes_incomplete", [tok.token_to_id("<0xE4>"),
                                                            tok.token_to_id("<0xB8>")]))
        cases.append(decode_entry(tok, "byte_continuation_only", [tok.token_to_id("<0xB8>")]))
        cases.append(decode_entry(tok, "bytes_complete", [tok.token_to_id(f"<0x{b:02X}>")
                                                          for b in "中".encode()]))
    inc_ids = [start] + enc("Search 中文 answer: café 🔍!") + [end]
    incremental = {
        "ids": inc_ids,
        "text_skip_special": [dec(tok, inc_ids[:k], True) for k in range(1, len(inc_ids) + 1)],
        "text_keep_special": [dec(tok, inc_ids[:k], False) for k in range(1, len(inc_ids) + 1)],
    }
    texts = [
        "The search engine returns information.",
        "<search> capital of France </search>",
        "<answer> Beijing </answer>",
        "Le café 中文搜索 🔍",
        "  leading spaces and\nnewlines\n\n",
        "Doc 1(Title: \"Search\") text",
    ]
    texts.append("a</s>b" if byte_fallback else "a<|im_end|>b")  # a special token in text
    encode = [{"text": t, "ids": enc(t)} for t in texts]
    return {"decode": cases, "incremental": incremental, "encode": encode}


def first_completion(tok, out, stop):
    """Index k of the first token whose decoded output contains `stop`, or None."""
    for k in range(len(out)):
        if stop in dec(tok, out[: k + 1], True):
            return k
    return None


def pick_stops(tok, out):
    """The "across" and "inside" stop cases of one greedy continuation (see the docstring),
    or None when the continuation has no such pair."""
    texts = [dec(tok, out[:k], True) for k in range(len(out) + 1)]
    picks = []

    def ascii_piece(k):
        a, b = texts[k], texts[k + 1]
        if not b.startswith(a):
            return None
        piece = b[len(a) :]
        return piece if piece.isascii() and piece.isprintable() else None

    # across: 2 chars before token k + first char of token k
    for k in range(2, len(out)):
        piece = ascii_piece(k)
        prev = texts[k]
        if piece is None or len(piece) < 2 or len(prev) < 2 or not prev[-2:].isascii():
            continue
        stop = prev[-2:] + piece[0]
        if stop.strip() and first_completion(tok, out, stop) == k:
            picks.append(("across", stop, k))
            break
    after = picks[0][2] + 1 if picks else 1
    for k in range(after, len(out)):
        piece = ascii_piece(k)
        if piece is None or len(piece) < 3:
            continue
        stop = piece[:2]
        if stop.strip() and first_completion(tok, out, stop) == k:
            picks.append(("inside", stop, k))
            break
    if [p[0] for p in picks] != ["across", "inside"]:
        return None
    cases = []
    for kind, stop, k in picks:
        full = texts[k + 1]
        cases.append(
            {
                "name": kind,
                "stop": stop,
                "output_ids": out[: k + 1],
                "text": full[: full.find(stop)],
                "text_no_trim": full,
                "matched_at": k,
            }
        )
    return cases


STOP_ORDER = ["len17", "len33", "len45", "len70", "len5", "chat", "len1"]


def stop_fixture(tok, cases):
    for name in STOP_ORDER:
        case = next(c for c in cases if c["name"] == name)
        picks = pick_stops(tok, case["output_ids"])
        if picks is None or "\ufffd" in picks[-1]["text_no_trim"]:
            continue
        if case["eos_at"] is not None and case["eos_at"] <= picks[-1]["matched_at"]:
            continue
        return {
            "model": "qwen-bpe",
            "source_case": name,
            "prompt_ids": case["prompt_ids"],
            "max_new_tokens": MAX_NEW_TOKENS,
            "cases": picks,
        }
    raise AssertionError("no qwen-bpe greedy case gives both stop cases")


# ---------------------------------------------------------------------------
# Building the models
# ---------------------------------------------------------------------------

def build_qwen():
    mdir = os.path.join(FIXTURES, "qwen-bpe")
    os.makedirs(mdir, exist_ok=True)
    tok = build_qwen_tokenizer()
    endoftext, _, im_end = (tok.token_to_id(t) for t in QWEN_SPECIALS)
    vocab = tok.get_vocab_size()
    cfg = Qwen2Config(
        vocab_size=vocab,
        num_hidden_layers=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=endoftext,
        eos_token_id=im_end,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).float().eval()
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    chat = render_chatml([{"role": "user", "content": CHAT_QUESTION}])
    prompts = greedy_prompts(enc, None) + [("chat", enc(chat))]
    cases, seed, factor = boosted_cases(
        "qwen-bpe", model, prompts, range(1001, 1011), lone_byte_ids(tok)
    )
    save_model(mdir, model, model.generation_config)
    write_tokenizer(
        mdir,
        tok,
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added_tokens_decoder(tok),
            "bos_token": None,
            "chat_template": CHATML_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 512,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    return model, tok, cases, (seed, factor), chat


def emulated_bf16_error(model, cases):
    """bf16_tolerance.measure of the CUDA engine's arithmetic on `model`'s greedy cases."""
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    cfg = model.config.to_dict()
    pairs = [(c["prompt_ids"], c["output_ids"]) for c in cases]
    return bf16_tolerance.measure(weights, cfg, pairs)


def build_cuda_model(name, base, make_model, prompts, seeds, damped):
    """A CUDA test model: `make_model()` (a fresh float32 model) initialised with weights of
    std CUDA_INIT_STD from the first seed whose greedy cases (on `prompts`) are varied, have
    every top-2 gap above MIN_MARGIN and an emulated bf16 error within CUDA_BF16_MAX_REL
    and CUDA_BF16_MAX_L2; lone-byte lm_head rows damped as for the other models. The
    tokenizer files and generation_config are `base`'s (already written). Returns (model,
    cases, seed, bf16 error)."""
    mdir, bdir = os.path.join(FIXTURES, name), os.path.join(FIXTURES, base)
    os.makedirs(mdir, exist_ok=True)
    model = make_model()
    model.generation_config = GenerationConfig.from_pretrained(bdir)  # its EOS ids
    for seed in seeds:
        init_weights(model, seed, CUDA_INIT_STD)
        with torch.no_grad():
            model.lm_head.weight[damped] *= BYTE_ROW_SCALE
        cases = greedy_cases(name, model, prompts)
        margin = min(c["min_margin"] for c in cases)
        ok = margin > MIN_MARGIN and all(varied(c["output_ids"]) for c in cases)
        err = emulated_bf16_error(model, cases) if ok else None
        print(f"  {name}: seed {seed}, min margin {margin:.2e}, varied "
              f"{all(varied(c['output_ids']) for c in cases)}, bf16 error {err}")
        if err and err["max_rel"] <= CUDA_BF16_MAX_REL and err["l2"] <= CUDA_BF16_MAX_L2:
            break
    else:
        raise AssertionError(f"{name}: no seed in {seeds} fits")
    save_model(mdir, model, model.generation_config)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(bdir, f), os.path.join(mdir, f))
    return model, cases, seed, err


def build_qwen_hd16(qcases, qtok):
    prompts = [(c["name"], c["prompt_ids"]) for c in qcases]

    def make():
        cfg = Qwen2Config(
            vocab_size=qtok.get_vocab_size(),
            num_hidden_layers=3,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=qtok.token_to_id("<|endoftext|>"),
            eos_token_id=qtok.token_to_id("<|im_end|>"),
            **{**SHAPE, "num_attention_heads": 2, "num_key_value_heads": 1},
        )
        torch.manual_seed(0)
        return Qwen2ForCausalLM(cfg).float().eval()

    return build_cuda_model("qwen-hd16", "qwen-bpe", make, prompts, range(4001, 4021),
                            lone_byte_ids(qtok))


def build_llama_hd64(lcases, ltok):
    prompts = [(c["name"], c["prompt_ids"]) for c in lcases]

    def make():
        cfg = LlamaConfig(
            vocab_size=ltok.get_vocab_size(),
            num_hidden_layers=2,
            attention_bias=False,
            bos_token_id=1,
            eos_token_id=2,
            head_dim=64,
            **{**SHAPE, "num_attention_heads": 2, "num_key_value_heads": 1},
        )
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).float().eval()

    return build_cuda_model("llama-hd64", "llama-sp", make, prompts, range(5001, 5021),
                            lone_byte_ids(ltok))


def render_chatml(messages):
    out = ""
    for i, m in enumerate(messages):
        if i == 0 and m["role"] != "system":
            out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        out += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def build_llama():
    mdir = os.path.join(FIXTURES, "llama-sp")
    os.makedirs(mdir, exist_ok=True)
    tok = build_llama_tokenizer()
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        num_hidden_layers=2,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2)
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    prompts = greedy_prompts(enc, 1)
    cases, seed, factor = boosted_cases(
        "llama-sp", model, prompts, range(2001, 2011), lone_byte_ids(tok)
    )
    save_model(mdir, model, model.generation_config)
    write_tokenizer(
        mdir,
        tok,
        {
            "add_bos_token": True,
            "add_eos_token": False,
            "add_prefix_space": True,
            "added_tokens_decoder": added_tokens_decoder(tok),
            "bos_token": "<s>",
            "clean_up_tokenization_spaces": False,
            "eos_token": "</s>",
            "legacy": False,
            "model_max_length": 512,
            "pad_token": None,
            "tokenizer_class": "LlamaTokenizer",
            "unk_token": "<unk>",
        },
    )
    return model, tok, cases, (seed, factor)


def build_tiny():
    mdir = os.path.join(FIXTURES, "tiny-vocab")
    os.makedirs(mdir, exist_ok=True)
    tok = build_tiny_tokenizer()
    assert tok.get_vocab_size() == 16
    prompt = tok.encode(SAMPLING_PROMPT, add_special_tokens=False).ids
    cfg = Qwen2Config(
        vocab_size=16,
        num_hidden_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=0,
        eos_token_id=0,
        **SHAPE,
    )
    # Seeds tried in order; the lm_head is scaled by the first factor (of a fixed grid)
    # that gives a spread distribution on which every sampling rule bites.
    for seed in range(3003, 3023):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg).float().eval()
        init_weights(model, seed=seed)
        head = model.lm_head.weight.detach().clone()
        for step in range(1, 41):
            scale = step * 0.1
            with torch.no_grad():
                model.lm_head.weight.copy_(head * scale)
                logits = model(torch.tensor([prompt])).logits[0, -1]
            if spread_ok(torch.softmax(logits.double(), -1)) and settings_ok(logits):
                break
        else:
            continue
        break
    else:
        raise AssertionError("no seed/scale gives a usable tiny-vocab distribution")
    save_model(mdir, model, GenerationConfig(bos_token_id=0, eos_token_id=0))
    write_tokenizer(
        mdir,
        tok,
        {
            "added_tokens_decoder": added_tokens_decoder(tok),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>",
            "model_max_length": 512,
            "pad_token": "<|endoftext|>",
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": "<|endoftext|>",
        },
    )
    return model, prompt, seed, scale


def sampling_fixture(model, prompt):
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    settings = []
    for name, t, k, tp, mp in SAMPLING_SETTINGS:
        probs, logprobs, _ = sglang_probs(logits, t, k, tp, mp)
        settings.append(
            {
                "name": name,
                "temperature": t,
                "top_k": k,
                "top_p": tp,
                "min_p": mp,
                "probs": probs.tolist(),
                "logprobs": logprobs.tolist(),
                "kept": int((probs > 0).sum()),
            }
        )
    return {
        "model": "tiny-vocab",
        "prompt_ids": prompt,
        "logits": logits.tolist(),
        "settings": settings,
    }


# ---------------------------------------------------------------------------
# Self checks
# ---------------------------------------------------------------------------

def check_model_folder(name, model, expect):
    mdir = os.path.join(FIXTURES, name)
    cfg = read_json(os.path.join(mdir, "config.json"))
    for k, v in expect.items():
        got = cfg
        for part in k.split("."):
            got = got[part]
        assert got == v, f"{name}/config.json {k}: {got!r} != {v!r}"
    reloaded = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    mine = dict(model.named_parameters())
    theirs = dict(reloaded.named_parameters())
    assert set(mine) == set(theirs)
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), f"{name}: weight {k} differs after reload"
    size = sum(os.path.getsize(os.path.join(mdir, f)) for f in os.listdir(mdir))
    assert size < FOLDER_LIMIT, f"{name}: {size} bytes"
    return reloaded, size


def check_greedy(model, cases):
    worst_gen, worst64 = 0.0, 0.0
    for c in cases:
        assert varied(c["output_ids"]), f"{c['model']}/{c['name']}: continuation not varied"
        assert c["min_margin"] > MIN_MARGIN, f"{c['model']}/{c['name']}: margin {c['min_margin']}"
        out, lps, _ = greedy_loop(model, c["prompt_ids"], MAX_NEW_TOKENS)
        assert out == c["output_ids"], f"{c['model']}/{c['name']}: reloaded model differs"
        worst_reload = max(abs(a - b) for a, b in zip(lps, c["logprobs"]))
        assert worst_reload <= RELOAD_TOL, f"{c['model']}/{c['name']}: {worst_reload}"
        gout, glps = greedy_generate(model, c["prompt_ids"], MAX_NEW_TOKENS)
        assert gout == out, f"{c['model']}/{c['name']}: generate() disagrees with the loop"
        worst_gen = max(worst_gen, max(abs(a - b) for a, b in zip(glps, lps)))
        worst64 = max(worst64, float64_check(model, c["prompt_ids"], out, lps))
    assert worst_gen < 1e-4 and worst64 < 1e-4, (worst_gen, worst64)
    return worst_gen, worst64


def check_tokenizer(name, decode_ref, chat=None):
    mdir = os.path.join(FIXTURES, name)
    raw = Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(mdir)
    assert len(hf) == raw.get_vocab_size()
    for case in decode_ref["decode"]:
        for skip, key in ((True, "text_skip_special"), (False, "text_keep_special")):
            assert dec(raw, case["ids"], skip) == case[key]
            assert hf.decode(case["ids"], skip_special_tokens=skip) == case[key], (name, case)
    inc = decode_ref["incremental"]
    for k in range(1, len(inc["ids"]) + 1):
        got = hf.decode(inc["ids"][:k], skip_special_tokens=True)
        assert got == inc["text_skip_special"][k - 1]
        got = hf.decode(inc["ids"][:k], skip_special_tokens=False)
        assert got == inc["text_keep_special"][k - 1]
    for e in decode_ref["encode"]:
        assert hf.encode(e["text"], add_special_tokens=False) == e["ids"], (name, e)
    if chat is not None:
        rendered = hf.apply_chat_template(
            [{"role": "user", "content": CHAT_QUESTION}], tokenize=False, add_generation_prompt=True
        )
        assert rendered == chat, (rendered, chat)
    splits = [c for c in decode_ref["decode"] if c["name"] == "multibyte_cut_mid_char"]
    assert splits and splits[0]["text_keep_special"].endswith("\ufffd")


def check_sampling(ref, model):
    with torch.no_grad():
        logits = model(torch.tensor([ref["prompt_ids"]])).logits[0, -1].float()
    assert logits.tolist() == ref["logits"]
    plain = ref["settings"][0]["probs"]
    assert max(plain) <= 0.4 and sum(1 for p in plain if p < 0.02) >= 3, plain
    lines = []
    for s in ref["settings"]:
        py = python_probs(ref["logits"], s["temperature"], s["top_k"], s["top_p"], s["min_p"])
        assert max(abs(a - b) for a, b in zip(py, s["probs"])) < 1e-12, s["name"]
        assert abs(sum(s["probs"]) - 1) < 1e-12
        z = [x / s["temperature"] for x in ref["logits"]]
        lse = max(z) + math.log(sum(math.exp(x - max(z)) for x in z))
        assert max(abs((x - lse) - y) for x, y in zip(z, s["logprobs"])) < 1e-12
        tv = 0.5 * sum(abs(a - b) for a, b in zip(s["probs"], plain))
        lines.append(f"{s['name']}: kept {s['kept']}/16, max p {max(s['probs']):.3f}, "
                     f"TV distance from plain {tv:.3f}")
    return lines


def check_stop(tok, ref, greedy_case):
    for c in ref["cases"]:
        out = c["output_ids"]
        assert out == greedy_case["output_ids"][: len(out)]
        k = c["matched_at"]
        assert len(out) == k + 1
        assert first_completion(tok, greedy_case["output_ids"], c["stop"]) == k
        before = dec(tok, out[:k], True)
        full = dec(tok, out, True)
        assert c["stop"] not in before and c["stop"] in full
        start = full.find(c["stop"])
        end = start + len(c["stop"])
        assert end > len(before), "stop string must be completed by the last token"
        if c["name"] == "across":
            assert start < len(before), "the 'across' stop string must start in an earlier token"
        else:
            assert start >= len(before), "the 'inside' stop string must lie in one token"
        assert end < len(full), "the stop string must end inside the completing token"
        assert c["text"] == full[:start] and c["text_no_trim"] == full
        eos_at = greedy_case["eos_at"]
        assert eos_at is None or eos_at > k, "EOS would stop generation before the stop string"


def check_biome(paths):
    biome = os.path.join(REPO, "node_modules", ".bin", "biome")
    if not os.path.exists(biome):
        return "biome not installed: format not checked"
    r = subprocess.run([biome, "format", *paths], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0 and "No files were processed" in r.stdout + r.stderr:
        return "biome.json excludes the fixtures: format not checked"
    assert r.returncode == 0, "biome would reformat the fixtures:\n" + r.stdout + r.stderr
    return "biome format: no changes"


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def main():
    if os.path.isdir(FIXTURES):
        shutil.rmtree(FIXTURES)
    os.makedirs(FIXTURES)

    qwen, qtok, qcases, qinfo, chat = build_qwen()
    llama, ltok, lcases, linfo = build_llama()
    tiny, tiny_prompt, tiny_seed, tiny_scale = build_tiny()
    qwen16, q16cases, q16seed, _ = build_qwen_hd16(qcases, qtok)
    llama64, l64cases, l64seed, _ = build_llama_hd64(lcases, ltok)
    for c in qcases + q16cases:
        c["text"] = dec(qtok, c["output_ids"], True)
    for c in lcases + l64cases:
        c["text"] = dec(ltok, c["output_ids"], True)
    key_order = ["model", "name", "prompt_ids", "output_ids", "logprobs", "eos_at", "text",
                 "min_margin"]
    greedy = {
        "max_new_tokens": MAX_NEW_TOKENS,
        "cases": [{k: c[k] for k in key_order} for c in qcases + lcases + q16cases + l64cases],
    }
    write_json(os.path.join(FIXTURES, "greedy.json"), greedy)
    write_json(os.path.join(FIXTURES, "sampling.json"), sampling_fixture(tiny, tiny_prompt))
    decode = {
        "qwen-bpe": decode_fixture(qtok, (qtok.token_to_id("<|im_start|>"),
                                          qtok.token_to_id("<|im_end|>")), False),
        "llama-sp": decode_fixture(ltok, (1, 2), True),
    }
    write_json(os.path.join(FIXTURES, "decode.json"), decode)
    stop = stop_fixture(qtok, qcases)
    write_json(os.path.join(FIXTURES, "stop.json"), stop)

    # ---- self checks, from the files on disk
    report = []
    greedy = read_json(os.path.join(FIXTURES, "greedy.json"))
    decode = read_json(os.path.join(FIXTURES, "decode.json"))
    sampling = read_json(os.path.join(FIXTURES, "sampling.json"))
    stop = read_json(os.path.join(FIXTURES, "stop.json"))
    sizes = {}
    for name, model, expect in (
        ("qwen-bpe", qwen, {"model_type": "qwen2", "vocab_size": qtok.get_vocab_size(),
                            "rope_parameters.rope_theta": 1000000.0,
                            "tie_word_embeddings": False, "dtype": "float32"}),
        ("llama-sp", llama, {"model_type": "llama", "vocab_size": ltok.get_vocab_size(),
                             "attention_bias": False, "tie_word_embeddings": False}),
        ("tiny-vocab", tiny, {"model_type": "qwen2", "vocab_size": 16}),
        ("qwen-hd16", qwen16, {"model_type": "qwen2", "vocab_size": qtok.get_vocab_size(),
                               "num_attention_heads": 2, "num_key_value_heads": 1,
                               "rope_parameters.rope_theta": 1000000.0,
                               "tie_word_embeddings": False, "dtype": "float32"}),
        ("llama-hd64", llama64, {"model_type": "llama", "vocab_size": ltok.get_vocab_size(),
                                 "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "head_dim": 64, "attention_bias": False,
                                 "tie_word_embeddings": False}),
    ):
        reloaded, sizes[name] = check_model_folder(name, model, expect)
        if name == "tiny-vocab":
            report += check_sampling(sampling, reloaded)
            continue
        cases = [c for c in greedy["cases"] if c["model"] == name]
        d_gen, d64 = check_greedy(reloaded, cases)
        report.append(f"{name}: reload bit-exact; generate() == loop (logprob max|d| "
                      f"{d_gen:.1e}); float64 argmax path equal, logprob max|d| {d64:.1e}")
        if name in ("qwen-hd16", "llama-hd64"):
            err = emulated_bf16_error(reloaded, cases)
            assert err["max_rel"] <= CUDA_BF16_MAX_REL and err["l2"] <= CUDA_BF16_MAX_L2, err
            report.append(f"{name}: emulated bf16 (CUDA engine) log-prob error max rel "
                          f"{err['max_rel']:.2e}, L2 {err['l2']:.2e}")
    check_tokenizer("qwen-bpe", decode["qwen-bpe"], chat)
    check_tokenizer("llama-sp", decode["llama-sp"])
    report.append("tokenizers: AutoTokenizer == tokenizers.Tokenizer on every decode/encode case")
    check_stop(qtok, stop, next(c for c in greedy["cases"]
                                if c["model"] == "qwen-bpe" and c["name"] == stop["source_case"]))
    report.append("stop: every case verified by decoding each prefix")
    files = sorted(
        os.path.relpath(os.path.join(d, f), REPO)
        for d, _, fs in os.walk(FIXTURES)
        for f in fs
    )
    report.append(check_biome([f for f in files if f.endswith(".json")]))

    # ---- summary
    print(f"qwen-bpe: vocab {qtok.get_vocab_size()}, seed {qinfo[0]}, EOS row x{qinfo[1]}")
    print(f"llama-sp: vocab {ltok.get_vocab_size()}, seed {linfo[0]}, EOS row x{linfo[1]}")
    print(f"tiny-vocab: seed {tiny_seed}, lm_head scale {tiny_scale:.1f}, prompt {tiny_prompt}")
    print(f"qwen-hd16: seed {q16seed}; llama-hd64: seed {l64seed}")
    for c in greedy["cases"]:
        print(f"  {c['model']:10s} {c['name']:6s} prompt {len(c['prompt_ids']):3d} eos_at "
              f"{str(c['eos_at']):4s} margin {c['min_margin']:.4f} distinct "
              f"{len(set(c['output_ids']))} {c['text'][:40]!r}")
    for c in stop["cases"]:
        print(f"  stop {c['name']}: {c['stop']!r} at token {c['matched_at']}, text {c['text']!r}")
    for line in report:
        print("check ok: " + line)
    total = 0
    for f in files:
        path = os.path.join(REPO, f)
        size = os.path.getsize(path)
        total += size
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:16]
        print(f"  {size:8d}  {digest}  {f}")
    print(f"  {total:8d}  total; folders: "
          + ", ".join(f"{k} {v / 1024:.0f} KB" for k, v in sizes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
