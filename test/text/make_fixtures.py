"""Generate the reference fixtures of test/text (issue 18, "Text"): token ids and rendered
chat prompts as transformers 5 produces them, for src/text to reproduce exactly.

Run from anywhere with a Python that has transformers (5.x) and tokenizers (CPU only, no
network; torch is imported only through test/engine/make_fixtures.py's JSON helpers):

    /work/venv/bin/python test/text/make_fixtures.py

Inputs (committed, read only):
  test/engine/fixtures/qwen-bpe/  Qwen2-style byte-level BPE tokenizer.json with <|endoftext|>
                                  448, <|im_start|> 449, <|im_end|> 450 (post-processor
                                  ByteLevel: adds no special tokens) and tokenizer_config.json
                                  with Qwen2's ChatML chat_template inside it.
  test/engine/fixtures/llama-sp/  SentencePiece-style tokenizer.json (<unk> 0, <s> 1, </s> 2;
                                  TemplateProcessing post-processor adding <s>), no template.
  test/text/fixtures/templates/   real chat templates, copied verbatim from the model repos'
                                  tokenizer_config.json:
      qwen2.5-instruct.jinja      Qwen/Qwen2.5-7B-Instruct (as quoted in huggingface.js
                                  packages/jinja/test/e2e.test.js)
      llama-3.2-instruct.jinja    meta-llama/Llama-3.2-3B-Instruct (llama.cpp
                                  models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja;
                                  calls strftime_now("%d %b %Y"))
      llama-3.1-instruct.jinja    meta-llama/Llama-3.1-8B-Instruct (huggingface.js e2e tests)
      llama-3-instruct.jinja      meta-llama/Meta-Llama-3-8B-Instruct
      llama-2-chat.jinja          meta-llama/Llama-2-7b-chat-hf (raise_exception on roles that
                                  do not alternate)
  templates/search-r1.txt         Search-R1's prompt, {question} replaced.

Outputs, under test/text/fixtures/:
  llama3/         a tiny Llama-3-style tokenizer in the layout of a current hub snapshot:
                  tokenizer.json = byte-level BPE trained here on CORPUS with Llama 3's
                  pipeline (no normalizer; Split on Llama 3's regex + ByteLevel pre-tokenizer;
                  BPE with ignore_merges; ByteLevel decoder; post-processor Sequence[ByteLevel,
                  TemplateProcessing "<|begin_of_text|> $A"]), then Llama 3.1/3.2's 256 special
                  tokens in their order (<|begin_of_text|>, <|end_of_text|>,
                  <|reserved_special_token_0|>, <|reserved_special_token_1|>,
                  <|finetune_right_pad_id|>, <|reserved_special_token_2|>,
                  <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|eot_id|>,
                  <|python_tag|>, <|reserved_special_token_3..247|>) right after the trained
                  vocabulary instead of at 128000; tokenizer_config.json as Meta ships it
                  (PreTrainedTokenizerFast, bos <|begin_of_text|>, eos <|eot_id|>, no
                  chat_template key); chat_template.jinja = Llama 3.2 Instruct's template, the
                  separate file transformers 5's save_pretrained writes (checked below).
  reference.json  {
    "versions": {transformers, tokenizers, jinja2},
    "now": the local time strftime_now returns while rendering ([Y, M, D, h, m, s]),
    "strftime": [{format, text}]: datetime(now).strftime(format),
    "conversations": {name: messages},
    "tokenizers": {name: {dir, special_tokens_map, encode: [{text, with_special,
                  without_special}]}}: tokenizer.encode(text, add_special_tokens=True/False),
    "chat": [{tokenizer, template ("own" = the folder's template, else a file in
              templates/), conversation, add_generation_prompt, text, ids} or {..., error}]:
              text = apply_chat_template(messages, add_generation_prompt, tokenize=False,
              chat_template=...), ids = the same with tokenize=True (transformers encodes the
              text with add_special_tokens=False); error = the TemplateError's message,
    "edge": {tokenizer, conversation, add_generation_prompt, variables, cases: [{name,
              template, text or error}]}: EDGE_TEMPLATES, small templates for each Jinja
              feature real templates use, rendered the same way with variables as **kwargs,
    "variables": {tokenizer, conversation, variables, text}: Llama 3.2's template with
              date_string passed as a kwarg,
    "config_flags": {tokenizer, changes, text, with_special, without_special}: transformers 5
              ignores tokenizer_config.json's add_bos_token / add_eos_token when a
              tokenizer.json exists (the file's post-processor decides),
    "template_file_wins": {template, conversation, text}: a folder with both a
              "chat_template" in tokenizer_config.json (ChatML) and chat_template.jinja
              (Qwen2.5's) renders with the .jinja file
  }

strftime_now is pinned to NOW while rendering (transformers calls datetime.now(); the
module's datetime is replaced for the run), so Llama 3.2's "Today Date" line is fixed.

Self-checks (the script fails loudly otherwise): every chat case's ids equal the raw
tokenizers library encoding its text without special tokens; every encode case equals the
raw tokenizers library's encode (transformers 5 adds exactly what tokenizer.json's
post-processor adds); the llama3 folder reloads with AutoTokenizer as a fast tokenizer with
the template, and saving it again with transformers 5 writes chat_template.jinja (same text)
and no "chat_template" in tokenizer_config.json; every error case is a TemplateError; the
JSON files are in biome's format (when node_modules/.bin/biome exists). Output is
deterministic: rerunning gives byte-identical files (sha256 printed in the summary).
"""

import datetime as dt
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")
TEMPLATES = os.path.join(FIXTURES, "templates")
ENGINE_FIXTURES = os.path.join(REPO, "test", "engine", "fixtures")

# The engine's fixture script formats JSON as biome does and builds added_tokens_decoder;
# reuse it (importing it sets the tokenizers/transformers environment variables too).
_spec = importlib.util.spec_from_file_location(
    "engine_fixtures", os.path.join(REPO, "test", "engine", "make_fixtures.py")
)
engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine)

import jinja2  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
import transformers.utils.chat_template_utils as chat_template_utils  # noqa: E402
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers.models import BPE  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

NOW = (2025, 3, 7, 9, 5, 3)  # a single-digit day: "%d" must zero-pad


class PinnedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(*NOW)


chat_template_utils.datetime = PinnedDatetime  # what strftime_now calls

# Llama 3's pre-tokenizer split (tokenizer.json of Meta-Llama-3 / 3.1 / 3.2).
LLAMA3_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3_VOCAB = 400  # trained tokens before the specials
LLAMA3_SPECIALS = (
    [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
)
assert len(LLAMA3_SPECIALS) == 256

CORPUS = """\
Answer the given question. You must conduct reasoning inside <think> and </think> first \
every time you get new information. After reasoning, if you find you lack some knowledge, you \
can call a search engine by <search> query </search> and it will return the top searched \
results between <information> and </information>. You can search as many times as you want.
If you find no further external knowledge needed, you can directly provide the answer inside \
<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>.
You are a helpful assistant. The user asks a question and the assistant answers it. The system \
message tells the assistant what to do. Who wrote the first search engine? Who got the first \
Nobel Prize in physics? Wilhelm Conrad Röntgen received the first Nobel Prize in Physics in 1901.
Doc 1(Title: "Nobel Prize in Physics") The Nobel Prize in Physics is awarded by the Royal \
Swedish Academy of Sciences. Doc 2(Title: "Search engine") A search engine ranks documents.
Cutting Knowledge Date: December 2023. Today Date: 26 Jul 2024. 12345 67890 2025 100 42.
Le café est très élégant, à côté de l'école. Zürich, München, naïve façade, crème brûlée.
中文搜索引擎可以回答问题。北京是中国的首都。 Emoji: 🔍 search, 📚 books, 🤖 model!
"""

SEARCH_R1_QUESTION = "who got the first nobel prize in physics?"


def search_r1_prompt(question):
    with open(os.path.join(REPO, "templates", "search-r1.txt"), encoding="utf-8") as f:
        return f.read().replace("{question}", question)


INFORMATION = (
    '\n\n<information>Doc 1(Title: "Nobel Prize in Physics") The first Nobel Prize in Physics '
    "was awarded in 1901 to Wilhelm Conrad Röntgen.\nDoc 2(Title: \"Röntgen\") Wilhelm Röntgen "
    "discovered X-rays.\n</information>\n\n"
)

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a careful researcher. Search before answering."},
        {"role": "user", "content": "Who wrote the novel Dune?"},
    ],
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "multi_turn": [
        {"role": "user", "content": "Who got the first Nobel Prize in Physics?"},
        {
            "role": "assistant",
            "content": "<think>I need to search.</think>\n<search> first nobel prize physics "
            "</search>",
        },
        {"role": "user", "content": INFORMATION.strip("\n")},
        {
            "role": "assistant",
            "content": "<think>Röntgen.</think>\n<answer> Wilhelm Röntgen </answer>",
        },
    ],
    "multi_turn_system": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
    ],
    "non_ascii": [
        {
            "role": "user",
            "content": "Wer gründete Zürich? 北京是中国的首都吗？ Emoji 🔍📚 naïve café — “quoted” ½",
        }
    ],
    "search_r1": [{"role": "user", "content": search_r1_prompt(SEARCH_R1_QUESTION)}],
    "whitespace": [
        {"role": "system", "content": "  padded system message \n"},
        {"role": "user", "content": "\n  leading and trailing whitespace \n\n"},
    ],
    "roles_not_alternating": [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ],
}

ENCODE_TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world\n\nNew paragraph\twith a tab   ",
    "",
    "Zürich 中文 🔍 naïve",
    "12345 6789012 2025",
    "<|im_start|>user\nWho?<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>[INST] Hello [/INST] Hi </s>",
    "</search>" + INFORMATION,
    search_r1_prompt(SEARCH_R1_QUESTION),
]

# (tokenizer, template): "own" is the folder's template; otherwise templates/<name>.jinja.
CHAT_CASES = [
    ("qwen-bpe", "own"),
    ("qwen-bpe", "qwen2.5-instruct"),
    ("llama3", "own"),
    ("llama3", "llama-3.1-instruct"),
    ("llama3", "llama-3-instruct"),
    ("llama-sp", "llama-2-chat"),
]

# Small templates for the Jinja features real chat templates use, rendered by transformers on
# qwen-bpe (bos_token unset, eos_token <|im_end|>, pad_token <|endoftext|>) for the
# "multi_turn_system" conversation with add_generation_prompt=True (and EDGE_VARIABLES as
# apply_chat_template **kwargs). Booleans, none and lists are never printed directly: Jinja2
# prints True/None/['a'] where @huggingface/jinja prints true/(nothing)/["a"].
EDGE_VARIABLES = {"enable_thinking": False, "custom": "value"}
EDGE_TEMPLATES = {
    "trailing_newline": "{{ messages[0]['content'] }}\n",
    "trailing_newlines": "{{ messages[0]['content'] }}\n\n",
    "special_and_undefined": (
        "[{{ bos_token }}][{{ eos_token }}][{{ pad_token }}][{{ nothing }}]"
        "{% if bos_token is defined %}B{% else %}b{% endif %}"
        "{% if eos_token is defined %}E{% else %}e{% endif %}"
    ),
    "tools_and_documents": (
        "{% if tools is defined %}D{% endif %}{% if tools is none %}N{% endif %}"
        "{% if documents is none %}n{% endif %}{% if tools %}T{% else %}F{% endif %}"
        "{% if not tools is defined %}{% set tools = none %}{% endif %}"
        "{% if tools is not none %}X{% endif %}"
    ),
    "generation_prompt": (
        "{% for m in messages %}<{{ m.role }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant-open>{% endif %}"
    ),
    "loop_and_namespace": (
        "{% set ns = namespace(users=0, last='') %}"
        "{% for m in messages %}{% if m.role == 'user' %}{% set ns.users = ns.users + 1 %}"
        "{% set ns.last = m.content %}{% endif %}"
        "{{ loop.index }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
        "{% if loop.last %}L{% endif %}{% if not loop.last %},{% endif %}{% endfor %}"
        "|{{ ns.users }}|{{ ns.last }}|{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}"
        "|{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if m.role == 'assistant' %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
        "|{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}"
    ),
    "string_methods": (
        "{% set c = '  <think>plan</think>\n\nAnswer: ' + messages[-1].content + '  ' %}"
        "[{{ c.strip() }}][{{ c.split('</think>')[-1].lstrip('\n') }}][{{ c.rstrip() }}]"
        "[{{ c | trim }}][{{ c.replace('plan', 'PLAN') }}]{% if 'think' in c %}I{% endif %}"
        "{% if c.strip().startswith('<think>') %}S{% endif %}"
        "{% if c.rstrip().endswith('?') %}Q{% endif %}[{{ (c | trim | length) }}]"
        "[{{ messages[1].content | upper }}][{{ 'a-b-c'.split('-') | join('+') }}]"
        "[{{ messages | map(attribute='role') | join(',') }}]"
        "[{{ messages | selectattr('role', 'equalto', 'user') | list | length }}]"
    ),
    "mapping_tests": (
        "{% for m in messages %}{% if m.content is string %}s{% endif %}"
        "{% if m is mapping %}m{% endif %}{% if 'tool_calls' in m %}t{% endif %}"
        "{% if m.tool_calls is defined %}d{% endif %}{% endfor %}"
        "|{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}"
    ),
    "tojson": (
        "{{ messages[0] | tojson }}|{{ {'q': 'Zürich 中文', 'n': [1, 2.5], 'x': none} | tojson }}"
        "|{{ {'a': 1, 'b': ['c']} | tojson(indent=2) }}"
    ),
    "whitespace_control": (
        "{%- for m in messages %}\n"
        "    {%- if m.role == 'user' %}\n"
        "        {{- '[U]' + m.content }}\n"
        "    {%- else %}\n"
        "        [{{ m.role }}]\n"
        "    {% endif %}\n"
        "{%- endfor %}\n"
        "  {% if add_generation_prompt %}\n"
        "  <gen>\n"
        "  {% endif %}\n"
        "end  {{- ' trimmed' -}}   !\n"
    ),
    "macro_and_set_block": (
        "{% macro turn(m, tag='T') %}<{{ tag }}:{{ m.role }}>{{ m.content }}{% endmacro %}"
        "{% set header %}H:{{ messages | length }}{% endset %}{{ header }}"
        "{% for m in messages %}{{ turn(m) }}{{ turn(m, tag='X') if loop.last }}{% endfor %}"
    ),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}"
    ),
    "kwargs": (
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>"
        "{% endif %}[{{ custom }}]"
    ),
    "strftime": "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}",
    "raise_exception": (
        "{% if messages | length > 1 %}"
        "{{ raise_exception('Only ' ~ 1 ~ ' message allowed, got ' ~ (messages | length)) }}"
        "{% endif %}ok"
    ),
    "default_and_ternary": (
        "[{{ missing | default('dflt') }}][{{ eos_token | default('x') }}]"
        "[{{ 'yes' if add_generation_prompt else 'no' }}][{{ messages[0].name | default('-') }}]"
    ),
}

STRFTIME_FORMATS = [
    "%d %b %Y",
    "%d %B %Y",
    "%Y-%m-%d",
    "%A, %B %d, %Y",
    "%a %b %d %H:%M:%S %Y",
    "%I:%M %p",
    "%y %j %e %%",
    "%-d %-m %-H",
]


def folder(name):
    if name == "llama3":
        return os.path.join(FIXTURES, "llama3")
    return os.path.join(ENGINE_FIXTURES, name)


def rel(path):
    return os.path.relpath(path, REPO)


def read_template(name):
    with open(os.path.join(TEMPLATES, f"{name}.jinja"), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------
# The Llama-3-style tokenizer
# ---------------------------------------------------------------------------

def build_llama3_tokenizer():
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=LLAMA3_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([ln for ln in CORPUS.splitlines() if ln], trainer=trainer)
    assert tok.get_vocab_size() == LLAMA3_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS]
    )
    bos = tok.token_to_id("<|begin_of_text|>")
    assert bos == LLAMA3_VOCAB, bos
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return tok


def write_llama3(template):
    mdir = os.path.join(FIXTURES, "llama3")
    shutil.rmtree(mdir, ignore_errors=True)
    os.makedirs(mdir)
    tok = build_llama3_tokenizer()
    engine.write_tokenizer(
        mdir,
        tok,
        {
            "added_tokens_decoder": engine.added_tokens_decoder(tok),
            "bos_token": "<|begin_of_text|>",
            "clean_up_tokenization_spaces": True,
            "eos_token": "<|eot_id|>",
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    with open(os.path.join(mdir, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(template)
    return mdir


def check_llama3(mdir, template):
    hf = AutoTokenizer.from_pretrained(mdir)
    assert hf.is_fast and hf.chat_template == template
    assert hf.bos_token == "<|begin_of_text|>" and hf.eos_token == "<|eot_id|>"
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        with open(os.path.join(tmp, "chat_template.jinja"), encoding="utf-8") as f:
            assert f.read() == template
        config = engine.read_json(os.path.join(tmp, "tokenizer_config.json"))
        assert "chat_template" not in config, "transformers 5 kept the template in the config"
    return "llama3 reloads; transformers 5's save_pretrained writes chat_template.jinja"


# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------

def encode_cases(name):
    mdir = folder(name)
    hf = AutoTokenizer.from_pretrained(mdir)
    raw = Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
    out = []
    for text in ENCODE_TEXTS:
        case = {"text": text}
        for special, key in ((True, "with_special"), (False, "without_special")):
            ids = hf.encode(text, add_special_tokens=special)
            assert ids == raw.encode(text, add_special_tokens=special).ids, (name, text)
            case[key] = ids
        out.append(case)
    return {
        "dir": rel(mdir),
        "special_tokens_map": hf.special_tokens_map,
        "encode": out,
    }


def chat_cases():
    out = []
    for tok_name, template_name in CHAT_CASES:
        mdir = folder(tok_name)
        hf = AutoTokenizer.from_pretrained(mdir)
        raw = Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
        template = None if template_name == "own" else read_template(template_name)
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (False, True):
                case = {
                    "tokenizer": tok_name,
                    "template": template_name,
                    "conversation": conv_name,
                    "add_generation_prompt": agp,
                }
                kw = {"add_generation_prompt": agp, "chat_template": template}
                try:
                    text = hf.apply_chat_template(messages, tokenize=False, **kw)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                    out.append(case)
                    continue
                ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
                assert ids == raw.encode(text, add_special_tokens=False).ids, case
                case["text"] = text
                case["ids"] = ids
                out.append(case)
    return out


def edge_cases():
    hf = AutoTokenizer.from_pretrained(folder("qwen-bpe"))
    messages = CONVERSATIONS["multi_turn_system"]
    out = []
    for name, template in EDGE_TEMPLATES.items():
        case = {"name": name, "template": template}
        try:
            case["text"] = hf.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=True,
                chat_template=template,
                **EDGE_VARIABLES,
            )
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        out.append(case)
    return out


def variables_case():
    """apply_chat_template kwargs reach the template: Llama 3.2's date_string replaces
    strftime_now's date."""
    hf = AutoTokenizer.from_pretrained(folder("llama3"))
    variables = {"date_string": "26 Jul 2024"}
    text = hf.apply_chat_template(
        CONVERSATIONS["user_only"], tokenize=False, add_generation_prompt=True, **variables
    )
    assert "Today Date: 26 Jul 2024" in text, text
    return {
        "tokenizer": "llama3",
        "conversation": "user_only",
        "variables": variables,
        "text": text,
    }


def config_flags_case():
    """transformers 5 drops add_bos_token/add_eos_token from tokenizer_config.json when a
    tokenizer.json is present: llama-sp still gets <s> and no </s>."""
    text = "Hello world"
    changes = {"add_bos_token": False, "add_eos_token": True}
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(folder("llama-sp"), f), tmp)
        path = os.path.join(tmp, "tokenizer_config.json")
        config = engine.read_json(path)
        config.update(changes)
        engine.write_json(path, config)
        hf = AutoTokenizer.from_pretrained(tmp)
        with_special = hf.encode(text, add_special_tokens=True)
        without = hf.encode(text, add_special_tokens=False)
    assert with_special[0] == 1 and with_special[-1] != 2, with_special
    return {
        "tokenizer": "llama-sp",
        "changes": changes,
        "text": text,
        "with_special": with_special,
        "without_special": without,
    }


def template_file_wins_case():
    conv = "user_only"
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(folder("qwen-bpe"), f), tmp)
        with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(read_template("qwen2.5-instruct"))
        hf = AutoTokenizer.from_pretrained(tmp)
        text = hf.apply_chat_template(
            CONVERSATIONS[conv], tokenize=False, add_generation_prompt=True
        )
    assert "You are Qwen" in text, text
    return {"template": "qwen2.5-instruct", "conversation": conv, "text": text}


def main():
    llama32 = read_template("llama-3.2-instruct")
    mdir = write_llama3(llama32)
    report = [check_llama3(mdir, llama32)]

    ref = {
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "jinja2": jinja2.__version__,
        },
        "now": list(NOW),
        "strftime": [
            {"format": f, "text": PinnedDatetime.now().strftime(f)} for f in STRFTIME_FORMATS
        ],
        "conversations": CONVERSATIONS,
        "tokenizers": {name: encode_cases(name) for name in ("qwen-bpe", "llama3", "llama-sp")},
        "chat": chat_cases(),
        "edge": {
            "tokenizer": "qwen-bpe",
            "conversation": "multi_turn_system",
            "add_generation_prompt": True,
            "variables": EDGE_VARIABLES,
            "cases": edge_cases(),
        },
        "variables": variables_case(),
        "config_flags": config_flags_case(),
        "template_file_wins": template_file_wins_case(),
    }
    assert "07 Mar 2025" in next(
        c["text"] for c in ref["chat"] if c["tokenizer"] == "llama3" and c["template"] == "own"
    )
    errors = [c for c in ref["chat"] if "error" in c]
    assert errors and all(c["template"] == "llama-2-chat" for c in errors), errors
    ref_path = os.path.join(FIXTURES, "reference.json")
    engine.write_json(ref_path, ref)

    files = [
        os.path.join(mdir, "tokenizer.json"),
        os.path.join(mdir, "tokenizer_config.json"),
        os.path.join(mdir, "chat_template.jinja"),
        ref_path,
    ]
    report.append(engine.check_biome([rel(f) for f in files if f.endswith(".json")]))

    n_chat = len(ref["chat"])
    print(f"llama3: {LLAMA3_VOCAB} trained tokens + {len(LLAMA3_SPECIALS)} specials")
    print(f"chat cases: {n_chat} ({len(errors)} template errors); encode cases: "
          + ", ".join(f"{k} {len(v['encode'])}" for k, v in ref["tokenizers"].items()))
    for line in report:
        print("check ok: " + line)
    for f in files:
        with open(f, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:16]
        print(f"  {os.path.getsize(f):8d}  {digest}  {rel(f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
