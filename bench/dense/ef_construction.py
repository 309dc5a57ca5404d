"""Recall against build time of searchr1-index build's HNSW graph at several efConstruction
values, with faiss 1.x's own build at the same M and efConstruction as the reference: the
measurement behind build-index's default --ef-construction (docs/commands/build-index.md).

    /usr/bin/python3 bench/dense/ef_construction.py --index-tool /tmp/build/searchr1-index \
        [--n 50000] [--dim 768] [--m 64] [--efc 40,80,160] [--faiss-efc 40,80] [--work DIR]

Data: faiss_bench.py's low-rank vectors (unit vectors near a random 32-dimensional subspace
plus isotropic noise, as learned embeddings are); queries from the same law, not in the
database. Ground truth: exact inner-product search (IndexFlatIP). Prints one JSON line per
build: who built it, efConstruction, build seconds, and recall@3 / recall@10 of faiss's
search of the file (faiss.read_index) at efSearch 16, 32, 64 and 128.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import faiss

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vectors import add_set_arguments, low_rank_set, recall  # noqa: E402


def report(who, efc, seconds, index, q, exact):
    row = {"by": who, "M": int(index.hnsw.nb_neighbors(1)), "ef_construction": efc,
           "build_seconds": round(seconds, 2), "n": int(index.ntotal)}
    for ef in (16, 32, 64, 128):
        index.hnsw.efSearch = ef
        _, found = index.search(q, 10)
        row[f"ef{ef}"] = {"recall@3": round(recall(found, exact, 3), 4),
                          "recall@10": round(recall(found, exact, 10), 4)}
    print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", required=True)
    add_set_arguments(ap, n=50000)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--efc", default="40,80,160")
    ap.add_argument("--faiss-efc", default="40")
    ap.add_argument("--work", default="/tmp/searchr1-efc")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    x, q, flat_path, exact = low_rank_set(args.n, args.dim, args.queries, args.work)
    for efc in [int(v) for v in args.efc.split(",") if v]:
        out = os.path.join(args.work, f"hnsw{args.m}-efc{efc}.index")
        t0 = time.time()
        subprocess.run([args.index_tool, "build", "--from", flat_path, "--type", f"HNSW{args.m}",
                        "--out", out, "--overwrite", "--ef-construction", str(efc)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report("searchr1", efc, time.time() - t0, faiss.read_index(out), q, exact)
    for efc in [int(v) for v in args.faiss_efc.split(",") if v]:
        index = faiss.IndexHNSWFlat(args.dim, args.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = efc
        t0 = time.time()
        index.add(x)
        report(f"faiss {faiss.__version__}", efc, time.time() - t0, index, q, exact)


if __name__ == "__main__":
    main()
