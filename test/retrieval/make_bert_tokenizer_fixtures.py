"""Generate transformers reference fixtures for BERT encoder folders whose tokenizer is not a
complete tokenizer.json (src/text/encoder-tokenizer.ts): what AutoTokenizer, as Search-R1's
retrieval_server.py and index_builder.py load it, makes of them.

Run from the repository root, after test/retrieval/make_bert_fixtures.py (whose vocabulary,
config.json and model.safetensors are reused), with torch, transformers (5.x), tokenizers and
safetensors:

    /work/venv/bin/python test/retrieval/make_bert_tokenizer_fixtures.py

It (re)writes, under test/retrieval/fixtures/bert-tokenizers/:

  wordpiece-saved/       tokenizer.json as `tokenizers`' BertWordPieceTokenizer.save() writes it
                         for a tokenizer it trained (post_processor null: BertWordPieceTokenizer
                         sets its BertProcessing only when given a vocabulary), built here from the
                         fixture vocabulary, and a tokenizer_config.json naming BertTokenizerFast
                         and nothing else. transformers 5 adds [CLS] ... [SEP] (BertTokenizer
                         sets its template whatever the file says); the file alone adds
                         nothing, and neither did transformers 4 (4.57 checked by hand).
  vocab-only/            vocab.txt (the same vocabulary, one token a line, in id order),
                         tokenizer_config.json (BertTokenizer with its options spelt out) and
                         special_tokens_map.json: an older BERT-family retriever's folder, with no
                         tokenizer.json.
  cases.json             the library versions, texts, and for each case (one of the two
                         folders, with its tokenizer_config.json / special_tokens_map.json
                         replaced or removed and keys of tokenizer.json replaced, as the case
                         says) what transformers' AutoTokenizer gives: the class it picked
                         and `input_ids` of each text with truncation=True,
                         max_length=MAX_LENGTH_IDS (unpadded). Cases that
                         searchr1 refuses (a class whose special tokens it does not know and a
                         tokenizer.json without post-processor) say "refused": true.
  expected.safetensors   per folder, with the fixture model (config.json and model.safetensors of
                         fixtures/bert/model, copied beside it by the tests): AutoTokenizer on
                         "passage: " + text with padding=True, truncation=True,
                         max_length=MAX_LENGTH (the model's positions, where build-index cuts)
                         gives `<folder>.input_ids` and `<folder>.attention_mask` (I64 [B, T]);
                         AutoModel's last_hidden_state, mean-pooled over the mask and
                         L2-normalised (index_builder.py's e5 recipe), gives `<folder>.mean`
                         (F32 [B, 64]).

Every case is built in a temporary folder that also holds the fixture's config.json
(model_type "bert"), as the tests build it, so AutoTokenizer resolves classes as it does for a
real encoder folder. The CI has no Python: the tests run from these committed files. Output is
deterministic (float32 on the CPU, eager attention).
"""

import copy
import json
import os
import re
import shutil
import tempfile

import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import BertWordPieceTokenizer
from transformers import AutoModel, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "fixtures", "bert", "model")
OUT = os.path.join(HERE, "fixtures", "bert-tokenizers")
MAX_LENGTH = 64  # the fixture model's max_position_embeddings
MAX_LENGTH_IDS = 16

TEXTS = [
    "Who wrote the Café CRÈME Brûlée recipe?",
    "東京 is the capital of Japan, and its largest city.",
    "THE Quick Brown FOX: ÅNGSTRÖMS, a naïve façade",
    "the [SEP] and [CLS] tokens written in the text, then [MASK]",
    "hi",
    "soft\u00adhyphen, zero\u200bwidth and a\ttab",
    "The retrieval model reads the question, then it searches the wiki for passages that "
    "answer it; the passages are ranked by the inner product of their embeddings with the "
    "query embedding, and the best ones are returned to the reasoning model. In 2024 there "
    "were 366 days, and the people of the world read many books about rivers, mountains, "
    "kings and queens, music and films, written in English, French and German.",
]

BERT_PROCESSING = {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}

VOCAB_ONLY_CONFIG = {
    "tokenizer_class": "BertTokenizer",
    "do_lower_case": True,
    "tokenize_chinese_chars": True,
    "strip_accents": None,
    "model_max_length": 512,
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
SPECIAL_TOKENS_MAP = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}

def case(name, base, files=None, patch=None, refused=False):
    """A case: the base folder, files replaced (None: removed), tokenizer.json keys replaced."""
    return {
        "name": name,
        "base": base,
        "files": files or {},
        "tokenizer_json": patch or {},
        "refused": refused,
    }


def config(**settings):
    return {"tokenizer_config.json": settings}


CASED_NORMALIZER = {
    "type": "BertNormalizer",
    "clean_text": True,
    "handle_chinese_chars": True,
    "strip_accents": None,
    "lowercase": False,
}

CASES = [
    case("wordpiece-saved", "wordpiece-saved"),
    *[
        case(cls, "wordpiece-saved", config(tokenizer_class=cls))
        for cls in [
            "BertTokenizer",
            "DistilBertTokenizer",
            "DistilBertTokenizerFast",
            "ConvBertTokenizer",
            "SqueezeBertTokenizer",
            "SqueezeBertTokenizerFast",
            "MobileBertTokenizer",
            "MobileBertTokenizerFast",
            "ElectraTokenizer",
            "ElectraTokenizerFast",
        ]
    ],
    # the class comes from config.json's model_type ("bert")
    case("no tokenizer_config.json", "wordpiece-saved", {"tokenizer_config.json": None}),
    # saved cased, but the config's do_lower_case (default true) decides, as in transformers
    case(
        "cased tokenizer.json, default do_lower_case",
        "wordpiece-saved",
        config(tokenizer_class="BertTokenizer"),
        {"normalizer": CASED_NORMALIZER},
    ),
    case(
        "do_lower_case false",
        "wordpiece-saved",
        config(tokenizer_class="BertTokenizerFast", do_lower_case=False),
    ),
    case("vocab-only", "vocab-only"),
    case(
        "vocab-only, cased, no Chinese-character split",
        "vocab-only",
        config(**{**VOCAB_ONLY_CONFIG, "do_lower_case": False, "tokenize_chinese_chars": False}),
    ),
    case(
        "vocab-only, accents kept",
        "vocab-only",
        config(tokenizer_class="BertTokenizer", strip_accents=False),
    ),
    case(
        "vocab-only, old folder: no class, specials from special_tokens_map.json",
        "vocab-only",
        {
            **config(do_lower_case=True, model_max_length=512),
            "special_tokens_map.json": {**SPECIAL_TOKENS_MAP, "cls_token": "[MASK]", "sep_token": "[PAD]"},
        },
    ),
    case(
        "vocab-only, no tokenizer_config.json",
        "vocab-only",
        {"tokenizer_config.json": None, "special_tokens_map.json": None},
    ),
    # a post-processor in the file: used as it is for any class
    case(
        "unknown class with a post-processor",
        "wordpiece-saved",
        config(tokenizer_class="PreTrainedTokenizerFast"),
        {"post_processor": BERT_PROCESSING},
    ),
    # refused: transformers adds nothing (or builds another model), unlike the model's training
    case("unknown class", "wordpiece-saved", config(tokenizer_class="PreTrainedTokenizerFast"), refused=True),
    case(
        "RobertaTokenizerFast",
        "wordpiece-saved",
        config(tokenizer_class="RobertaTokenizerFast"),
        refused=True,
    ),
    case(
        "vocab-only, XLMRobertaTokenizer",
        "vocab-only",
        config(tokenizer_class="XLMRobertaTokenizer"),
        refused=True,
    ),
]


def write_json(path, value):
    text = json.dumps(value, indent=2, ensure_ascii=False)
    # lists of numbers on one line
    text = re.sub(
        r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    )
    with open(path, "w") as f:
        f.write(text + "\n")


def fixture_vocab():
    with open(os.path.join(MODEL, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    return {t: i for i, t in enumerate(tokens)}


def write_folders(vocab):
    shutil.rmtree(OUT, ignore_errors=True)
    saved = os.path.join(OUT, "wordpiece-saved")
    os.makedirs(saved)
    # What BertWordPieceTokenizer.save() writes after train(): its components, no post-processor.
    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(TEXTS, vocab_size=100, min_frequency=1)
    assert json.loads(trained.to_str())["post_processor"] is None
    tok = BertWordPieceTokenizer(vocab, lowercase=True)
    tok.post_processor = None
    tok.save(os.path.join(saved, "tokenizer.json"))
    ours, theirs = json.loads(tok.to_str()), json.loads(trained.to_str())
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert ours[key] == theirs[key], key
    write_json(os.path.join(saved, "tokenizer_config.json"), {"tokenizer_class": "BertTokenizerFast"})

    only = os.path.join(OUT, "vocab-only")
    os.makedirs(only)
    with open(os.path.join(only, "vocab.txt"), "w") as f:
        f.write("".join(t + "\n" for t in vocab))
    write_json(os.path.join(only, "tokenizer_config.json"), VOCAB_ONLY_CONFIG)
    write_json(os.path.join(only, "special_tokens_map.json"), SPECIAL_TOKENS_MAP)


def case_folder(root, base, files, patch):
    """The base folder with the fixture's config.json, files replaced and tokenizer.json patched."""
    d = tempfile.mkdtemp(dir=root)
    shutil.copytree(os.path.join(OUT, base), d, dirs_exist_ok=True)
    shutil.copy(os.path.join(MODEL, "config.json"), d)
    for name, value in files.items():
        path = os.path.join(d, name)
        if value is None:
            os.remove(path)
        else:
            write_json(path, value)
    if patch:
        path = os.path.join(d, "tokenizer.json")
        with open(path) as f:
            tj = json.load(f)
        tj.update(copy.deepcopy(patch))
        write_json(path, tj)
    return d


def run_cases(root, vocab):
    cases = []
    for c in CASES:
        name, refused = c["name"], c["refused"]
        d = case_folder(root, c["base"], c["files"], c["tokenizer_json"])
        entry = dict(c)
        try:
            tok = AutoTokenizer.from_pretrained(d)
            entry["class"] = type(tok).__name__
            entry["input_ids"] = [
                tok(t, truncation=True, max_length=MAX_LENGTH_IDS)["input_ids"] for t in TEXTS
            ]
        except Exception as e:  # noqa: BLE001 - recorded: what transformers does with it
            assert refused, f"{name}: {e}"
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if not refused:
            # the class's [CLS] and [SEP] (the file's, for a class without them)
            cls = vocab["[CLS]"] if tok.cls_token_id is None else tok.cls_token_id
            sep = vocab["[SEP]"] if tok.sep_token_id is None else tok.sep_token_id
            assert all(ids[0] == cls and ids[-1] == sep for ids in entry["input_ids"]), name
        cases.append(entry)
        print(f"{name}: {entry.get('class', entry.get('error'))}")
    return cases


def pooled(root, base, model):
    d = case_folder(root, base, {}, {})
    tok = AutoTokenizer.from_pretrained(d)
    inputs = tok(["passage: " + t for t in TEXTS], max_length=MAX_LENGTH, padding=True, truncation=True,
                 return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], return_dict=True)
    mask = inputs["attention_mask"]
    hidden = out.last_hidden_state.masked_fill(~mask[..., None].bool(), 0.0)
    mean = torch.nn.functional.normalize(hidden.sum(dim=1) / mask.sum(dim=1)[..., None], dim=-1)
    lengths = mask.sum(dim=1).tolist()
    assert max(lengths) == MAX_LENGTH, lengths  # the long text is cut
    return {
        f"{base}.input_ids": inputs["input_ids"].to(torch.int64).contiguous(),
        f"{base}.attention_mask": mask.to(torch.int64).contiguous(),
        f"{base}.mean": mean.contiguous(),
    }


def main():
    vocab = fixture_vocab()
    write_folders(vocab)
    root = tempfile.mkdtemp()
    try:
        cases = run_cases(root, vocab)
        model = AutoModel.from_pretrained(MODEL, attn_implementation="eager").float().eval()
        tensors = {}
        for base in ("wordpiece-saved", "vocab-only"):
            tensors.update(pooled(root, base, model))
    finally:
        shutil.rmtree(root)
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    # (the versions go to cases.json: a one-key header is written in the same order every run)
    save_file(tensors, os.path.join(OUT, "expected.safetensors"), metadata={"max_length": str(MAX_LENGTH)})
    write_json(
        os.path.join(OUT, "cases.json"),
        {"versions": versions, "max_length": MAX_LENGTH_IDS, "texts": TEXTS, "cases": cases},
    )
    for dirpath, _, names in os.walk(OUT):
        for name in names:
            os.chmod(os.path.join(dirpath, name), 0o644)  # safetensors writes 0600
    print(f"wrote {OUT}: {len(cases)} cases, {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
