"""Generate the end-to-end fixtures of dense (e5) retrieval: a small Search-R1-format corpus,
faiss index files built from transformers' embeddings of it, and what Search-R1's server
would answer for a few queries.

Run from the repository root, after make_bert_fixtures.py (it uses that random BERT), with
torch, transformers, faiss and numpy:

    /work/venv/bin/pip install faiss-cpu
    /work/venv/bin/python test/retrieval/make_dense_fixtures.py

It (re)writes, under test/retrieval/fixtures/dense/:

  corpus.jsonl        60 passages {"id", "contents": "\\"Title\\"\\n text"}, ids "doc-<row>"
  e5_Flat.index       faiss IndexFlatIP of the passages' embeddings (index_builder.py's
                      recipe: "passage: " + contents, mean pooling, L2 normalisation)
  e5_HNSW.index       faiss IndexHNSWFlat (M 8, efConstruction 40, efSearch 16, inner product)
                      of the same embeddings
  expected.json       max_length, k, the queries, and for each index faiss's top-k row ids
                      and scores for the queries encoded as retrieval_server.py encodes them
                      ("query: " + q, mean pooling, L2 normalisation)

Texts are cut to min(256, max_position_embeddings) tokens, as searchr1 cuts them for an
encoder with fewer positions than Search-R1's 256. Deterministic: fixed seeds, one thread.
"""

import json
import random
from pathlib import Path

import faiss
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

ROOT = Path(__file__).resolve().parent / "fixtures"
MODEL = ROOT / "bert" / "model"
OUT = ROOT / "dense"
K = 5

WORDS = (
    "river mountain castle harbor library garden tower bridge market village forest "
    "island valley desert temple palace canal meadow lighthouse monastery vineyard "
    "orchard glacier volcano lagoon quarry mill abbey fortress citadel"
).split()
NAMES = "Alma Borin Cato Delia Eskil Fenna Goran Hilde Ivo Juna Kasimir Lotte".split()


def corpus_rows(n):
    rng = random.Random(7)
    rows = []
    for i in range(n):
        title = f"{rng.choice(NAMES)} {rng.choice(WORDS).title()}"
        text = " ".join(rng.choice(WORDS + NAMES) for _ in range(rng.randint(6, 40)))
        rows.append({"id": f"doc-{i}", "contents": f'"{title}"\n{text}.'})
    return rows


def encode(tokenizer, model, texts, max_length):
    """Search-R1's Encoder.encode: tokenize (pad to longest, truncate), mean-pool, normalise."""
    out = []
    for start in range(0, len(texts), 16):
        batch = tokenizer(
            texts[start : start + 16],
            max_length=max_length,
            padding=True,
            truncation=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.ascontiguousarray(np.concatenate(out).astype(np.float32))


def main():
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModel.from_pretrained(MODEL).eval()
    max_length = min(256, model.config.max_position_embeddings)

    rows = corpus_rows(60)
    with open(OUT / "corpus.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    passages = encode(tokenizer, model, ["passage: " + r["contents"] for r in rows], max_length)
    d = passages.shape[1]

    flat = faiss.IndexFlatIP(d)
    flat.add(passages)
    faiss.write_index(flat, str(OUT / "e5_Flat.index"))
    hnsw = faiss.IndexHNSWFlat(d, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 40
    hnsw.add(passages)
    hnsw.hnsw.efSearch = 16
    faiss.write_index(hnsw, str(OUT / "e5_HNSW.index"))

    rng = random.Random(11)
    queries = [" ".join(rng.choice(WORDS + NAMES) for _ in range(rng.randint(1, 6))) for _ in range(10)]
    queries.append(rows[3]["contents"].split("\n")[1])  # a passage's own text
    encoded = encode(tokenizer, model, ["query: " + q for q in queries], max_length)
    expected = {"faiss": faiss.__version__, "max_length": max_length, "k": K, "queries": queries}
    for name, index in (("flat", flat), ("hnsw", hnsw)):
        scores, ids = index.search(encoded, K)
        expected[name] = {"ids": ids.tolist(), "scores": scores.tolist()}
    with open(OUT / "expected.json", "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
