"""Generate reference fixtures for the native cross-encoder (the reranker:
native/src/model/bert.cpp `BertEncoder::classify`, `searchr1-index serve --reranker`,
`searchr1 serve-retriever --reranker`).

Run from the repository root with Debian's python3-torch (apt-get install -y python3-torch
libopenblas0); transformers, sentence-transformers, tokenizers and safetensors are not needed:

    /usr/bin/python3 test/retrieval/make_cross_encoder_fixtures.py

What sentence-transformers' CrossEncoder.predict computes for a BERT cross-encoder such as
cross-encoder/ms-marco-MiniLM-L12-v2 is written out here in plain torch, each part after the
transformers / sentence-transformers / tokenizers code it stands for:
  - the tokenizer: BertTokenizer (transformers' models/bert/tokenization_bert.py:
    BasicTokenizer then WordpieceTokenizer), the pair template `[CLS] A [SEP] B [SEP]` with
    token types 0 and 1, and truncation 'longest_first' as the fast tokenizer does it
    (tokenizers' tokenizers/src/utils/truncation.rs `truncate_encodings`, to max_length less
    the 3 special tokens), max_length = min(tokenizer's model_max_length,
    max_position_embeddings) (sentence-transformers' models/Transformer.py);
  - the model: BertForSequenceClassification's forward (transformers'
    models/bert/modeling_bert.py), eager attention, float32 on the CPU, the batch padded to
    its longest pair;
  - the activation: config.json's sentence_transformers.activation_fn is
    torch.nn.modules.linear.Identity (as ms-marco-MiniLM-L12-v2's), so the scores are the
    logits.

It (re)writes, under test/retrieval/fixtures/cross-encoder/:

  model/            config.json (BertForSequenceClassification, one label), model.safetensors
                    (F32, BertForSequenceClassification's tensor names: bert.*, classifier.*),
                    tokenizer.json and tokenizer_config.json (the vocabulary of
                    fixtures/bert/model, model_max_length 48 < max_position_embeddings 64, so
                    that truncation is exercised). Hidden 64, 2 layers, 4 heads, every
                    parameter random (token-type embeddings, LayerNorms, pooler, classifier).
  corpus.jsonl      six passages in Search-R1's corpus format ({"id", "contents":
                    "\\"Title\\"\\ntext"}), one of them too long for max_length
  expected.json     max_length; queries; for each query and each corpus row, the passage text
                    as Search-R1's rerank_server.py builds it ("(Title: <first line>) <rest>"),
                    input_ids, token_type_ids and the score; and extra pairs whose query and
                    passage are both long (both truncated), with theirs.

Output is deterministic (fixed seed).
"""

import json
import os
import struct
import unicodedata

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "cross-encoder")
VOCAB_FROM = os.path.join(HERE, "fixtures", "bert", "model")
MODEL_MAX_LENGTH = 48

CORPUS = [
    ("Paris", "Paris is the capital and the most populous city of France."),
    ("Tokyo", "Tokyo is the capital of Japan, and its largest city."),
    ("Retrieval", "The retrieval model reads the question, then it searches the wiki for "
     "passages that answer it; the passages are ranked by the inner product of their "
     "embeddings with the query embedding, and the best ones are returned to the reasoning "
     "model, which reads them before it answers the question."),
    ("Leap year", "In 2024 there were 366 days."),
    ("Music", "The song was written by a French king for his queen."),
    ("River", "The river runs north through the old town to the sea."),
]
QUERIES = [
    "what is the capital of france?",
    "Who wrote the Café song?",
    "how many days were there in 2024",
]
LONG_PAIRS = [
    (
        "what is the name of the largest city in the north of the country where the old king "
        "was born, and which river runs through it",
        CORPUS[2][1],
    ),
    ("how many days", CORPUS[2][1] + " " + CORPUS[0][1]),
]


# ---- the tokenizer --------------------------------------------------------------------------


def is_punctuation(ch):
    """tokenization_bert.py _is_punctuation: ASCII non-alphanumerics and Unicode P*."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(cp):
    """tokenization_bert.py BasicTokenizer._is_chinese_char."""
    return any(
        lo <= cp <= hi
        for lo, hi in [
            (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
        ]
    )


def basic_tokens(text):
    """BasicTokenizer.tokenize with do_lower_case (accents stripped): clean the text, space
    around CJK characters, split on whitespace, lower-case and strip accents (NFD, drop Mn),
    split off each punctuation character."""
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n\r"):
            continue
        if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
            cleaned.append(" ")
        elif is_cjk(cp):
            cleaned.append(f" {ch} ")
        else:
            cleaned.append(ch)
    out = []
    for word in "".join(cleaned).split():
        word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        piece = ""
        for ch in word:
            if is_punctuation(ch):
                if piece:
                    out.append(piece)
                out.append(ch)
                piece = ""
            else:
                piece += ch
        if piece:
            out.append(piece)
    return out


def wordpiece(word, vocab):
    """WordpieceTokenizer.tokenize: greedy longest match first, "##" continuations; a word
    that cannot be covered (or longer than 100 characters) is [UNK]."""
    if len(word) > 100:
        return [vocab["[UNK]"]]
    ids, start = [], 0
    while start < len(word):
        end = len(word)
        found = None
        while start < end:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in vocab:
                found = vocab[sub]
                break
            end -= 1
        if found is None:
            return [vocab["[UNK]"]]
        ids.append(found)
        start = end
    return ids


def encode_text(text, vocab):
    return [i for w in basic_tokens(text) for i in wordpiece(w, vocab)]


def truncate_longest_first(a, b, max_length):
    """tokenizers' truncate_encodings, LongestFirst with a pair: with n1 <= n2, keep n1 and
    cut n2 to max(n1, max_length - n1); if both still do not fit, n1 = max_length // 2 and
    n2 = n1 + max_length % 2 (the longer keeps the odd token; the second on a tie)."""
    if len(a) + len(b) <= max_length:
        return a, b
    n1, n2 = len(a), len(b)
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > max_length else max(n1, max_length - n1)
    if n1 + n2 > max_length:
        n1 = max_length // 2
        n2 = n1 + max_length % 2
    if swap:
        n1, n2 = n2, n1
    return a[:n1], b[:n2]


def encode_pair(query, passage, vocab, max_length):
    """The pair as CrossEncoder.predict's tokenizer call makes it (truncation='longest_first',
    max_length): [CLS] query [SEP] passage [SEP], types 0 then 1."""
    a, b = truncate_longest_first(encode_text(query, vocab), encode_text(passage, vocab), max_length - 3)
    ids = [vocab["[CLS]"], *a, vocab["[SEP]"], *b, vocab["[SEP]"]]
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    return ids, types


def passage_text(contents):
    """Search-R1's rerank_server.py BaseCrossEncoder._passage_to_string."""
    lines = contents.split("\n")
    return f"(Title: {lines[0]}) " + "\n".join(lines[1:])


# ---- the model ------------------------------------------------------------------------------


def make_weights(vocab_size, c, std=0.2):
    """BertForSequenceClassification's tensors, random (std 0.2 as in fixtures/bert, so that
    attention is far from uniform; bench/dense/rerank_bench.py asks for less, nearer a trained
    model's, for its 12 layers), LayerNorm weights around 1."""
    g = torch.Generator().manual_seed(4321)
    H, I = c["hidden_size"], c["intermediate_size"]

    def r(*shape, mean=0.0, std=std):
        return (mean + std * torch.randn(*shape, generator=g)).float()

    w = {
        "bert.embeddings.word_embeddings.weight": r(vocab_size, H),
        "bert.embeddings.position_embeddings.weight": r(c["max_position_embeddings"], H),
        "bert.embeddings.token_type_embeddings.weight": r(c["type_vocab_size"], H),
        "bert.embeddings.LayerNorm.weight": r(H, mean=1.0, std=0.3),
        "bert.embeddings.LayerNorm.bias": r(H),
    }
    for l in range(c["num_hidden_layers"]):
        p = f"bert.encoder.layer.{l}."
        for name, shape in [
            ("attention.self.query", (H, H)), ("attention.self.key", (H, H)),
            ("attention.self.value", (H, H)), ("attention.output.dense", (H, H)),
            ("intermediate.dense", (I, H)), ("output.dense", (H, I)),
        ]:
            w[p + name + ".weight"] = r(*shape)
            w[p + name + ".bias"] = r(shape[0])
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"] = r(H, mean=1.0, std=0.3)
            w[p + ln + ".bias"] = r(H)
    w["bert.pooler.dense.weight"] = r(H, H)
    w["bert.pooler.dense.bias"] = r(H)
    w["classifier.weight"] = r(1, H, std=0.5)
    w["classifier.bias"] = r(1)
    return w


def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def linear(x, w, name):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def bert_sequence_classification(w, c, input_ids, token_type_ids, attention_mask):
    """BertForSequenceClassification.forward (modeling_bert.py) at inference (dropout is the
    identity); the logits [B, num_labels]."""
    B, T = input_ids.shape
    H, heads, eps = c["hidden_size"], c["num_attention_heads"], c["layer_norm_eps"]
    d = H // heads
    # BertEmbeddings: inputs_embeds + token_type_embeddings, += position_embeddings (absolute),
    # LayerNorm.
    pos = torch.arange(T).expand(B, T)
    x = w["bert.embeddings.word_embeddings.weight"][input_ids]
    x = x + w["bert.embeddings.token_type_embeddings.weight"][token_type_ids]
    x = x + w["bert.embeddings.position_embeddings.weight"][pos]
    x = layer_norm(x, w["bert.embeddings.LayerNorm.weight"], w["bert.embeddings.LayerNorm.bias"], eps)
    # BertModel: the extended attention mask, (1 - mask) * finfo.min added to the scores.
    bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for l in range(c["num_hidden_layers"]):
        p = f"bert.encoder.layer.{l}."

        def split(t):
            return t.view(B, T, heads, d).transpose(1, 2)

        # BertSelfAttention (eager): softmax(q k^T / sqrt(d) + mask) v, heads concatenated.
        q = split(linear(x, w, p + "attention.self.query"))
        k = split(linear(x, w, p + "attention.self.key"))
        v = split(linear(x, w, p + "attention.self.value"))
        scores = q @ k.transpose(-1, -2) / (d ** 0.5) + bias
        ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H)
        # BertSelfOutput: LayerNorm(dense(ctx) + input).
        h = layer_norm(
            linear(ctx, w, p + "attention.output.dense") + x,
            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps,
        )
        # BertIntermediate: gelu (the exact erf form, hidden_act "gelu"); BertOutput:
        # LayerNorm(dense(.) + h).
        inner = torch.nn.functional.gelu(linear(h, w, p + "intermediate.dense"))
        x = layer_norm(
            linear(inner, w, p + "output.dense") + h,
            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps,
        )
    # BertPooler: tanh(dense(first token)); then classifier (nn.Linear(hidden, num_labels)).
    pooled = torch.tanh(linear(x[:, 0], w, "bert.pooler.dense"))
    return linear(pooled, w, "classifier")


def score_pairs(w, c, pairs):
    """CrossEncoder.predict: one padded batch (pad id 0, mask 0), logits[:, 0], Identity."""
    T = max(len(ids) for ids, _ in pairs)
    ids = torch.zeros(len(pairs), T, dtype=torch.long)
    types = torch.zeros(len(pairs), T, dtype=torch.long)
    mask = torch.zeros(len(pairs), T, dtype=torch.long)
    for i, (row, ty) in enumerate(pairs):
        ids[i, : len(row)] = torch.tensor(row)
        types[i, : len(row)] = torch.tensor(ty)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        return bert_sequence_classification(w, c, ids, types, mask)[:, 0]


# ---- files ----------------------------------------------------------------------------------


def write_safetensors(path, tensors):
    """The safetensors layout: u64 header length, JSON header (offsets into the data), data."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"format": "pt", "torch": torch.__version__}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    model_dir = os.path.join(OUT, "model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(VOCAB_FROM, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    write_json(os.path.join(model_dir, "tokenizer.json"), tokenizer)
    with open(os.path.join(VOCAB_FROM, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    tok_config["model_max_length"] = MODEL_MAX_LENGTH
    write_json(os.path.join(model_dir, "tokenizer_config.json"), tok_config)

    c = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": len(vocab),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "hidden_act": "gelu",
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
        "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"},
    }
    write_json(os.path.join(model_dir, "config.json"), c)
    w = make_weights(len(vocab), c)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), w)

    with open(os.path.join(OUT, "corpus.jsonl"), "w") as f:
        for i, (title, text) in enumerate(CORPUS):
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}, ensure_ascii=False) + "\n")

    max_length = min(MODEL_MAX_LENGTH, c["max_position_embeddings"])
    pairs = []
    for q in QUERIES:
        for title, text in CORPUS:
            pairs.append((q, passage_text(f'"{title}"\n{text}')))
    pairs += LONG_PAIRS
    encoded = [encode_pair(q, p, vocab, max_length) for q, p in pairs]
    scores = score_pairs(w, c, encoded)
    # the same in float64: how far float32 rounding alone moves a score
    w64 = {k: v.double() for k, v in w.items()}
    scores64 = score_pairs(w64, c, encoded)
    lengths = sorted(len(ids) for ids, _ in encoded)
    assert lengths[-1] == max_length, lengths
    write_json(
        os.path.join(OUT, "expected.json"),
        {
            "max_length": max_length,
            "queries": QUERIES,
            "pairs": [
                {"query": q, "passage": p, "input_ids": ids, "token_type_ids": ty, "score": float(s)}
                for (q, p), (ids, ty), s in zip(pairs, encoded, scores.tolist())
            ],
        },
    )
    for root, _, names in os.walk(OUT):
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    print(
        f"wrote {OUT}: {len(pairs)} pairs, lengths {lengths[0]}..{lengths[-1]}, scores "
        f"{scores.min():.3f}..{scores.max():.3f}, |float32 - float64| <= "
        f"{(scores.double() - scores64).abs().max():.2e}"
    )


if __name__ == "__main__":
    main()
