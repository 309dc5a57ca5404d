"""Recall against speed of `searchr1-index serve` at several efSearch values and with exact
rescoring (--rescore-from): the measurement behind serve's default --ef-search and
--rescore-candidates (docs/commands/serve-retriever.md).

    /usr/bin/python3 bench/dense/serve_recall.py --index-tool /tmp/build/searchr1-index \
        [--n 50000] [--dim 768] [--m 64] [--ef 16,32,64,128] [--candidates 1,2,4,8] [--work DIR]

Data: faiss_bench.py's low-rank vectors (unit vectors near a random 32-dimensional subspace
plus isotropic noise, as learned embeddings are); queries from the same law, not in the
database. Ground truth: exact inner-product search (faiss IndexFlatIP). Builds, with
`searchr1-index build`, HNSW{M} at efConstruction 40 (faiss's default, as Search-R1's
e5_HNSW64.index was built), HNSW{M},SQ8 and SQ8, then serves each file with its queries in
one `search` command of k = 10 (the best of 3 runs' search_seconds) and prints one JSON line
per setting: the file, the flags, recall@3 and recall@10 against exact search, queries/s.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vectors import add_set_arguments, low_rank_set, recall  # noqa: E402


def serve(tool, index, flags, q, k, threads):
    """The ids of serve's search of q, and its best search_seconds over 3 runs."""
    cmd = [tool, "serve", "--index", index, "--threads", str(threads), *flags]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = json.dumps({"op": "search", "k": k, "vectors": q.tolist()}) + "\n"
    best, ids = float("inf"), None
    for _ in range(3):
        p.stdin.write(line)
        p.stdin.flush()
        r = json.loads(p.stdout.readline())
        if not r["ok"]:
            raise SystemExit(f"{' '.join(cmd)}: {r['error']}")
        best, ids = min(best, r["search_seconds"]), r["ids"]
    p.stdin.close()
    p.wait()
    return ids, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", required=True)
    add_set_arguments(ap, n=50000)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--ef", default="16,32,64,128")
    ap.add_argument("--candidates", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/searchr1-serve-recall")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    _, q, flat_path, exact = low_rank_set(args.n, args.dim, args.queries, args.work)
    files = {}
    for factory, extra in [(f"HNSW{args.m}", ["--ef-construction", "40"]),
                           (f"HNSW{args.m},SQ8", []), ("SQ8", [])]:
        out = os.path.join(args.work, factory.replace(",", "_") + ".index")
        subprocess.run([args.index_tool, "build", "--from", flat_path, "--type", factory,
                        "--out", out, "--overwrite", *extra],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        files[factory] = out
    efs = [v for v in args.ef.split(",") if v]
    rescore = [["--rescore-from", flat_path, "--rescore-candidates", c]
               for c in args.candidates.split(",") if c]
    runs = [(flat_path, [])]
    runs += [(files[f"HNSW{args.m}"], ["--ef-search", ef]) for ef in efs]
    runs += [(files[f"HNSW{args.m},SQ8"], ["--ef-search", ef]) for ef in efs]
    runs += [(files[f"HNSW{args.m},SQ8"], ["--ef-search", "64", *r]) for r in rescore]
    runs += [(files["SQ8"], [])] + [(files["SQ8"], r) for r in rescore]
    for index, flags in runs:
        ids, seconds = serve(args.index_tool, index, flags, q, 10, args.threads)
        print(json.dumps({"index": os.path.basename(index),
                          "flags": " ".join(f for f in flags if f != flat_path),
                          "recall@3": round(recall(ids, exact, 3), 4),
                          "recall@10": round(recall(ids, exact, 10), 4),
                          "queries_per_s": round(len(q) / seconds)}), flush=True)


if __name__ == "__main__":
    main()
