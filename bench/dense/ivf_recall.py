"""IVF-PQ built and served by searchr1 against faiss's own: build time, file size, recall@10
and queries/s at several nprobe: the measurement behind serve's default --nprobe
(docs/commands/serve-retriever.md) and the build's check against faiss.

    /usr/bin/python3 bench/dense/ivf_recall.py --index-tool /tmp/build/searchr1-index \
        [--n 100000] [--dim 768] [--nlist 1024] [--m 64] [--nprobe 1,4,16,64] [--work DIR]

Data: faiss_bench.py's low-rank vectors (unit vectors near a random 32-dimensional subspace
plus isotropic noise, as learned embeddings are); queries from the same law, not in the
database. Ground truth: exact inner-product search (faiss IndexFlatIP). Builds
IVF{nlist},PQ{m} with `searchr1-index build` and with faiss (index_factory with
METRIC_INNER_PRODUCT, train and add on all the vectors, as Search-R1's index_builder.py;
"PQ{m}np", without the polysemous training ours leaves out, unless --polysemous: it only
renumbers the PQ centroids, and took faiss 1.7.3 over 27 minutes here), both on all threads, and prints one JSON line each with the seconds and bytes; then, per
nprobe, one line with recall@10 and queries/s of: our file served by `searchr1-index serve`
(one `search` command of all queries, the best of 3 runs' search_seconds), faiss's file
served the same way, faiss's search of faiss's file, and our file with --rescore-from the
flat file.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import faiss

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_recall import serve  # noqa: E402
from vectors import add_set_arguments, low_rank_set, recall  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", required=True)
    add_set_arguments(ap, n=100000)
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--nprobe", default="1,4,16,64")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--polysemous", action="store_true",
                    help="faiss's build with its polysemous training (index_factory's default; "
                         "over 27 min at these defaults on 2 cores, which ours leaves out)")
    ap.add_argument("--work", default="/tmp/searchr1-ivf-recall")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    faiss.omp_set_num_threads(args.threads)
    x, q, flat_path, exact = low_rank_set(args.n, args.dim, args.queries, args.work)
    factory = f"IVF{args.nlist},PQ{args.m}"
    ours = os.path.join(args.work, "ours.index")
    start = time.time()
    subprocess.run([args.index_tool, "build", "--from", flat_path, "--type", factory, "--out", ours,
                    "--overwrite", "--threads", str(args.threads)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(json.dumps({"build": "searchr1", "factory": factory, "n": args.n, "d": args.dim,
                      "seconds": round(time.time() - start, 1), "bytes": os.path.getsize(ours)}), flush=True)
    theirs = os.path.join(args.work, "faiss.index")
    start = time.time()
    index = faiss.index_factory(args.dim, factory + ("" if args.polysemous else "np"),
                                faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    seconds = time.time() - start
    faiss.write_index(index, theirs)
    print(json.dumps({"build": "faiss " + faiss.__version__,
                      "factory": factory + ("" if args.polysemous else "np"), "n": args.n, "d": args.dim,
                      "seconds": round(seconds, 1), "bytes": os.path.getsize(theirs)}), flush=True)
    for p in [int(v) for v in args.nprobe.split(",") if v]:
        row = {"nprobe": p}
        for name, file, flags in [("ours", ours, []), ("faiss_file", theirs, []),
                                  ("ours_rescored", ours, ["--rescore-from", flat_path])]:
            ids, secs = serve(args.index_tool, file, ["--nprobe", str(p), *flags], q, 10, args.threads)
            row[name] = {"recall@10": round(recall(ids, exact, 10), 4), "queries_per_s": round(len(q) / secs)}
        index.nprobe = p
        best = float("inf")
        for _ in range(3):
            start = time.time()
            _, found = index.search(q, 10)
            best = min(best, time.time() - start)
        row["faiss_search"] = {"recall@10": round(recall(found, exact, 10), 4),
                               "queries_per_s": round(len(q) / best)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
