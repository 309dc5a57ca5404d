"""Generate PyTorch/transformers reference fixtures for the native BERT encoder
(native/src/model/bert.cpp, `searchr1-index encode`).

Run from the repository root with torch, transformers (5.x), tokenizers and safetensors:

    /work/venv/bin/python test/retrieval/make_bert_fixtures.py

It (re)writes, under test/retrieval/fixtures/bert/:

  model/                 a small random BERT in e5-base-v2's architecture, saved by
                         transformers: config.json, model.safetensors (F32), tokenizer.json
                         and tokenizer_config.json. Vocabulary (~300) of whole words, word pieces
                         (##...) and single characters, built here (WordPiece, lower-cased and
                         accent-stripped as bert-base-uncased is); hidden 64, 2 layers, 4 heads,
                         intermediate 128, max_position_embeddings 64; LayerNorm weights and
                         biases randomised too, so every parameter matters.
  texts.json             the texts ("query: ..." and "passage: ..." as e5 wants them: mixed
                         case, accents, CJK, one longer than max_length) and max_length
  expected.safetensors   what Search-R1's Encoder computes for them: AutoTokenizer(padding=True,
                         truncation=True, max_length) gives `input_ids` and `attention_mask`
                         (I64 [B, T]); AutoModel's last_hidden_state pooled as retrieval_server.py's
                         pooling() does then torch.nn.functional.normalize gives `mean` and `cls`
                         (F32 [B, 64]); __metadata__ holds the library versions.

The script also checks that the tokenizers library alone (tokenizer.json with the same
truncation and padding) gives transformers' ids, which is how searchr1 tokenizes. The CI has
no Python: the tests run from these committed files. Output is deterministic (fixed seed,
float32 on the CPU, eager attention).
"""

import json
import os
import string

import numpy as np
import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerFast

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bert")
MAX_LENGTH = 32

TEXTS = [
    "query: what is the capital of france?",
    "query: Who wrote the Café CRÈME Brûlée recipe?",
    "query: hi",
    "query: how many ÅNGSTRÖMS are in one metre",
    "passage: Paris is the capital and the most populous city of France.",
    "passage: 東京 is the capital of Japan, and its largest city.",
    "passage: The retrieval model reads the question, then it searches the wiki for passages "
    "that answer it; the passages are ranked by the inner product of their embeddings with the "
    "query embedding, and the best ones are returned to the reasoning model.",
    "passage: In 2024 there were 366 days.",
    "query: xylophone zebras quickly searching",
    "passage: Searching retrieves documents.",
]

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
the a an of and is are in on to for with by it its that this there were was be what who
how many one most city capital france paris japan largest wrote recipe query passage
model models read reads question answer search searches searching wiki rank ranked
inner product their embedding with best return returned reason reasoning day days year
in are then they them which from or not as at all more can has have had
people time world new first last two three four five ten hundred thousand number
water river mountain country state king queen war book film song music team game
name named called known born died life house school university language english
french german city town north south east west old young good great small large long
high low left right home work play written directed founded built used made make
when where why whose after before during between under over about into than also only
""".split()
PIECES = """
##s ##es ##ed ##ing ##er ##ers ##al ##ly ##tion ##ment ##ness ##able ##ous ##ive ##ic
##ieve ##iev ##ages ##age retr doc ##ument ##uments pop ##ul ##ula ##ated me ##tre
ang ##st ##rom ##e ##d ##y ##ian
""".split()


def vocabulary():
    """Special tokens, then whole words, word pieces and single characters (and their ## forms)."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = SPECIALS + WORDS + PIECES + chars + ["##" + c for c in string.ascii_lowercase + string.digits]
    vocab = {}
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    return vocab


def make_tokenizer(vocab):
    """BERT's tokenizer.json pipeline: BertNormalizer (lower-case, strip accents, space around
    CJK characters), BertPreTokenizer, WordPiece with [UNK], [CLS] $A [SEP]."""
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(SPECIALS)
    return tok


def make_model(vocab_size):
    torch.manual_seed(1234)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        # larger than BERT's 0.02 so that attention is far from uniform: masking mistakes show
        initializer_range=0.2,
        pad_token_id=0,
        attn_implementation="eager",
    )
    # with the pooler, as e5-base-v2's checkpoint has it (the encoder ignores it)
    model = BertModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    return model


def pooling(last_hidden_state, attention_mask, pooling_method):
    """Search-R1's retrieval_server.py pooling(), without the pooler branch."""
    if pooling_method == "mean":
        last_hidden = last_hidden_state.masked_fill(~attention_mask[..., None].bool(), 0.0)
        return last_hidden.sum(dim=1) / attention_mask.sum(dim=1)[..., None]
    return last_hidden_state[:, 0]


def main():
    model_dir = os.path.join(OUT, "model")
    os.makedirs(model_dir, exist_ok=True)
    vocab = vocabulary()
    tok = make_tokenizer(vocab)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        do_lower_case=True,
    )
    fast.save_pretrained(model_dir)
    # As e5-base-v2's tokenizer_config.json says (AutoTokenizer then builds BertTokenizer from
    # tokenizer.json).
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    with open(config_path) as f:
        tok_config = json.load(f)
    tok_config["tokenizer_class"] = "BertTokenizer"
    with open(config_path, "w") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for extra in ("special_tokens_map.json", "vocab.txt"):
        path = os.path.join(model_dir, extra)
        if os.path.exists(path):
            os.remove(path)

    model = make_model(len(vocab))
    model.save_pretrained(model_dir, safe_serialization=True)

    # Reload both as the retriever does.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").float().eval()
    inputs = tokenizer(TEXTS, max_length=MAX_LENGTH, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], return_dict=True)
    mask = inputs["attention_mask"]
    mean = torch.nn.functional.normalize(pooling(out.last_hidden_state, mask, "mean"), dim=-1)
    cls = torch.nn.functional.normalize(pooling(out.last_hidden_state, mask, "cls"), dim=-1)

    # The tokenizers library alone, configured as transformers' call: the same ids.
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    raw.enable_truncation(MAX_LENGTH)
    raw.enable_padding(pad_id=vocab["[PAD]"], pad_token="[PAD]")
    encodings = raw.encode_batch(TEXTS)
    assert np.array_equal(np.array([e.ids for e in encodings]), inputs["input_ids"].numpy()), "ids differ"
    assert np.array_equal(np.array([e.attention_mask for e in encodings]), mask.numpy()), "masks differ"
    lengths = mask.sum(dim=1).tolist()
    assert max(lengths) == MAX_LENGTH and min(lengths) < MAX_LENGTH // 4, lengths

    save_file(
        {
            "input_ids": inputs["input_ids"].to(torch.int64).contiguous(),
            "attention_mask": mask.to(torch.int64).contiguous(),
            "mean": mean.contiguous(),
            "cls": cls.contiguous(),
        },
        os.path.join(OUT, "expected.safetensors"),
        metadata={
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "max_length": str(MAX_LENGTH),
        },
    )
    with open(os.path.join(OUT, "texts.json"), "w") as f:
        json.dump({"max_length": MAX_LENGTH, "texts": TEXTS}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for root, _, names in os.walk(OUT):
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)  # safetensors writes 0600
    print(f"wrote {OUT}: {len(TEXTS)} texts, lengths {lengths}, vocab {len(vocab)}")


if __name__ == "__main__":
    main()
