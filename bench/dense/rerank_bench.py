#!/usr/bin/env python3
"""The competitor's side of `npm run bench:dense -- --parts rerank` (bench/dense/rerank.ts
runs it): a cross-encoder of cross-encoder/ms-marco-MiniLM-L12-v2's shape scoring Search-R1's
rerank workload.

  rerank_bench.py check
  rerank_bench.py make-model --out DIR [--seed S]
  rerank_bench.py make-pairs --model DIR --out FILE --queries N --candidates C [--seed S]
  rerank_bench.py score --model DIR --pairs FILE --threads N --batch-size B [--repeat R]

check       prints the competitor that will run and its versions as JSON: {"competitor":
            "sentence-transformers", "sentence_transformers", "transformers", "torch",
            "python", "blas"} when `import sentence_transformers` works, else {"competitor":
            "torch", "torch", "python", "blas"}.
make-model  writes a seeded random BertForSequenceClassification of ms-marco-MiniLM-L12-v2's
            shape (BERT, 12 layers, hidden 384, 12 heads, intermediate 1536, 512 positions,
            2 token types, one label, activation Identity) as a Hugging Face folder:
            config.json, model.safetensors (F32), vocab.txt and tokenizer_config.json
            (BertTokenizer, lower case, model_max_length 512). The vocabulary has
            bert-base-uncased's layout and size (30,522: [PAD] 0, [unused*], [UNK] 100, [CLS]
            101, [SEP] 102, [MASK] 103, punctuation, digits, letters, their "##" forms, a few
            "##" suffixes, then generated lower-case words); the weights are
            test/retrieval/make_cross_encoder_fixtures.py's `make_weights` (its seed) at std
            WEIGHT_STD. A random model is as fast as a trained one. Prints {"params",
            "seconds"}.
make-pairs  writes FILE: {"queries": [N strings], "documents": [N lists of C {"id",
            "contents"}] in Search-R1's corpus format ("\\"Title\\"\\ntext"), "pairs": [N·C
            [query, passage]]}, each query with its own candidates only, the passage as
            Search-R1's rerank_server.py builds it ("(Title: <first line>) <rest>"). Queries
            are 6 to 14 words with a question mark; passages a title of 1 to 3 capitalised
            words and 70 to 140 words of text in sentences (commas, full stops, some numbers
            and suffixed words that WordPiece splits): about 100 to 200 tokens a pair, as
            wiki-18's 100-word passages make. Prints {"pairs", "seconds"}.
score       the competitor. With sentence-transformers: CrossEncoder(DIR, device="cpu") as
            Search-R1's rerank_server.py loads it, then CrossEncoder.predict(pairs,
            batch_size=B) (tokenizer, forward, activation: the whole call). Without it: the
            same computation in plain PyTorch, test/retrieval/make_cross_encoder_fixtures.py's
            (its BertTokenizer and 'longest_first' truncation to max_length = min(512,
            max_position_embeddings), and BertForSequenceClassification's forward, eager,
            fp32), the pairs in slices of B, each padded to its longest pair as predict pads
            them; the pure-Python tokenizer runs before the clock (it stands for the Rust
            one sentence-transformers uses), so only the forwards are timed. Both:
            torch.set_num_threads(N); one untimed slice warms up; then R timed passes over
            all pairs, the best reported. Also the first slice again in float64 (the same
            forward, weights cast): how far float32 rounding alone moves a score. Prints
            {"competitor", "seconds" (best pass), "passes", "scores" (the last pass),
            "input_ids" (per pair, plain PyTorch only; else null), "tokenize_seconds",
            "fp64_rows", "fp64_max_diff"}.

Exit status 3 when torch cannot be imported.
"""

import argparse
import json
import os
import platform
import random
import struct
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as err:
    print(f"rerank_bench.py: {err} (needs torch and numpy)", file=sys.stderr)
    sys.exit(3)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: torch_stack
sys.path.insert(0, os.path.join(ROOT, "test", "retrieval"))  # the cross-encoder reference
import make_cross_encoder_fixtures as reference  # noqa: E402
from torch_stack import blas_name, stack  # noqa: E402

try:
    import sentence_transformers
    import transformers
except ImportError:
    sentence_transformers = None

# cross-encoder/ms-marco-MiniLM-L12-v2's config.json (a BertForSequenceClassification).
MINILM_L12 = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute",
    "pad_token_id": 0,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
    "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"},
}
MODEL_MAX_LENGTH = 512
# The random weights' std: transformers initialises BERT at 0.02 (initializer_range), the
# fixture's 2-layer model uses 0.2, whose 12-layer version amplifies float32 rounding alone
# to ~1e-3 of a score; at 0.05 attention is still far from uniform, the scores spread (about
# 4 to 7) and float32 against float64 moves a score by ~1e-5.
WEIGHT_STD = 0.05
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
SUFFIXES = ["s", "ed", "ing", "ly", "er", "ion"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def cmd_check(_args):
    if sentence_transformers is not None:
        print(json.dumps({"competitor": "sentence-transformers",
                          "sentence_transformers": sentence_transformers.__version__,
                          **stack(torch, transformers)}))
    else:
        print(json.dumps({"competitor": "torch", "torch": torch.__version__,
                          "python": platform.python_version(), "blas": blas_name(torch)}))


# ---- the model ------------------------------------------------------------------------------


def make_vocab(size, seed):
    """bert-base-uncased's layout, then generated words (unique, 3 to 10 letters)."""
    vocab = ["[PAD]", *[f"[unused{i}]" for i in range(99)], "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    singles = list(PUNCTUATION) + list("0123456789") + list(LETTERS)
    vocab += singles + ["##" + c for c in "0123456789" + LETTERS] + ["##" + s for s in SUFFIXES]
    taken = set(vocab)
    rng = random.Random(seed)
    while len(vocab) < size:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 10)))
        if word not in taken:
            taken.add(word)
            vocab.append(word)
    return vocab


def cmd_make_model(args):
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    c = dict(MINILM_L12)
    vocab = make_vocab(c["vocab_size"], args.seed)
    with open(os.path.join(args.out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    reference.write_json(os.path.join(args.out, "tokenizer_config.json"), {
        "tokenizer_class": "BertTokenizer", "do_lower_case": True,
        "model_max_length": MODEL_MAX_LENGTH, "unk_token": "[UNK]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
    })
    reference.write_json(os.path.join(args.out, "config.json"), c)
    w = reference.make_weights(c["vocab_size"], c, WEIGHT_STD)
    reference.write_safetensors(os.path.join(args.out, "model.safetensors"), w)
    print(json.dumps({"params": sum(t.numel() for t in w.values()),
                      "seconds": time.perf_counter() - start}))


def read_vocab(model):
    with open(os.path.join(model, "vocab.txt")) as f:
        return {token: i for i, token in enumerate(f.read().split("\n")[:-1])}


def load_weights(model):
    """model.safetensors (F32 only, as make-model writes it) into torch tensors."""
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit(f"rerank_bench.py: {name}: {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[begin:end], dtype="<f4").copy()).reshape(info["shape"])
    return out


# ---- the pairs ------------------------------------------------------------------------------


def cmd_make_pairs(args):
    start = time.perf_counter()
    words = [t for t in read_vocab(args.model) if t.isalpha() and t.islower() and len(t) >= 3]
    rng = random.Random(args.seed)

    def word():
        w = rng.choice(words)
        r = rng.random()
        if r < 0.08:
            return w + rng.choice(SUFFIXES)  # split by WordPiece: w ##suffix (or another cut)
        if r < 0.10:
            return str(rng.randint(1, 2024))  # digits: 1 ##9 ##8 ##7
        return w

    def sentence(n):
        ws = [word() for _ in range(n)]
        ws[0] = ws[0].capitalize()
        if n > 8 and rng.random() < 0.5:
            ws[rng.randint(2, n - 3)] += ","
        return " ".join(ws) + "."

    def body(n):
        sentences = []
        while n > 0:
            k = min(n, rng.randint(8, 20))
            sentences.append(sentence(k))
            n -= k
        return " ".join(sentences)

    queries, documents, pairs = [], [], []
    for q in range(args.queries):
        query = " ".join(word() for _ in range(rng.randint(6, 14))) + "?"
        docs = []
        for c in range(args.candidates):
            title = " ".join(word().capitalize() for _ in range(rng.randint(1, 3)))
            contents = f'"{title}"\n{body(rng.randint(70, 140))}'
            docs.append({"id": str(q * args.candidates + c), "contents": contents})
            pairs.append([query, reference.passage_text(contents)])
        queries.append(query)
        documents.append(docs)
    with open(args.out, "w") as f:
        json.dump({"queries": queries, "documents": documents, "pairs": pairs}, f)
    print(json.dumps({"pairs": len(pairs), "seconds": time.perf_counter() - start}))


# ---- the competitor -------------------------------------------------------------------------


def cmd_score(args):
    torch.set_num_threads(args.threads)
    with open(args.pairs) as f:
        pairs = [tuple(p) for p in json.load(f)["pairs"]]
    with open(os.path.join(args.model, "config.json")) as f:
        c = json.load(f)
    b = args.batch_size
    max_length = min(MODEL_MAX_LENGTH, c["max_position_embeddings"])
    vocab = read_vocab(args.model)
    t = time.perf_counter()
    encoded = [reference.encode_pair(q, p, vocab, max_length) for q, p in pairs]
    tokenize_seconds = time.perf_counter() - t
    w = load_weights(args.model)

    if sentence_transformers is not None:
        # As Search-R1's rerank_server.py: CrossEncoder(model_name_or_path, device=...),
        # predict(pairs, batch_size=...).
        model = sentence_transformers.CrossEncoder(args.model, device="cpu")

        def run(rows):
            return [float(s) for s in model.predict(rows, batch_size=b, show_progress_bar=False)]

        inputs = pairs
        ids = None
    else:
        def run(rows):
            return [s for i in range(0, len(rows), b)
                    for s in reference.score_pairs(w, c, rows[i:i + b]).tolist()]

        inputs = encoded
        ids = [row for row, _ in encoded]
    run(inputs[:b])  # warm-up
    passes, scores = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        scores = run(inputs)
        passes.append(time.perf_counter() - t)
    # float32 rounding alone: the first slice through the same forward in float64
    first = encoded[:b]
    w64 = {k: v.double() for k, v in w.items()}
    s32 = reference.score_pairs(w, c, first).double()
    s64 = reference.score_pairs(w64, c, first)
    print(json.dumps({
        "competitor": "sentence-transformers" if sentence_transformers is not None else "torch",
        "seconds": min(passes), "passes": passes, "scores": scores, "input_ids": ids,
        "tokenize_seconds": tokenize_seconds, "fp64_rows": len(first),
        "fp64_max_diff": float((s32 - s64).abs().max()),
    }))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    m = sub.add_parser("make-model")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    q = sub.add_parser("make-pairs")
    q.add_argument("--model", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--queries", type=int, default=64)
    q.add_argument("--candidates", type=int, default=10)
    q.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("score")
    s.add_argument("--model", required=True)
    s.add_argument("--pairs", required=True)
    s.add_argument("--threads", type=int, required=True)
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    {"check": cmd_check, "make-model": cmd_make_model, "make-pairs": cmd_make_pairs,
     "score": cmd_score}[args.cmd](args)


if __name__ == "__main__":
    main()
