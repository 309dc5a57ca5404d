"""Fixtures for IndexIVFPQ, as searchr1-index reads, searches and builds it
(native/src/index/ivf_pq.h, ivf_pq_build.h).

Run from the repository root with Debian's python3-faiss (1.7.3) or pip's faiss-cpu, after
make_faiss_fixtures.py made flat-ip.index and flat-l2.index (their vectors and queries are
reused):

    /usr/bin/python3 test/retrieval/make_faiss_ivf_fixtures.py --index-tool /tmp/build/searchr1-index

It (re)writes, under test/retrieval/fixtures/faiss/:

  ivfpq-ip.index       index_factory(64, "IVF16,PQ8", inner product) trained and filled with
                       flat-ip's 1200 vectors (Search-R1's kind: by_residual, 8-bit codes)
  ivfpq-l2.index       index_factory(32, "IVF8,PQ8x4", L2) over flat-l2's 1000 vectors (4-bit
                       codes: the packed code layout, the L2 residual tables)
  <name>.expected.safetensors   `queries` (flat-ip's / flat-l2's) and faiss's
                       `nprobe<P>.k10.ids` / `nprobe<P>.k10.scores` for each nprobe P
  ivf-check.json       `searchr1-index build --type IVF16,PQ8 --from flat-ip.index`, read and
                       searched by faiss: its class and parameters, on how many queries faiss's
                       search of our file returns other ids than `searchr1-index search` and the
                       largest score difference; and recall@10 against exact search of our
                       IVF-PQ and of faiss's at the same nlist / M / nprobe, on flat-ip and on
                       20,000 x 64 low-rank unit vectors (500 queries) where the comparison is
                       less noisy
"""

import argparse
import json
import os
import struct
import subprocess
import tempfile

import faiss
import numpy as np

from make_faiss_build_fixtures import read_expected_queries
from make_faiss_fixtures import OUT, write_safetensors

NPROBES = {"ivfpq-ip": [1, 4, 16], "ivfpq-l2": [1, 3, 8]}


def vectors_of(name):
    flat = faiss.read_index(os.path.join(OUT, f"{name}.index"))
    return np.array(faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d)).reshape(flat.ntotal, flat.d)


def ivfpq_case(name, factory, metric, xb, q):
    index = faiss.index_factory(xb.shape[1], factory, metric)
    index.train(xb)
    index.add(xb)
    faiss.write_index(index, os.path.join(OUT, f"{name}.index"))
    tensors = [("queries", q)]
    for p in NPROBES[name]:
        index.nprobe = p
        D, I = index.search(q, 10)
        tensors += [(f"nprobe{p}.k10.ids", I.astype(np.int64)), (f"nprobe{p}.k10.scores", D.astype(np.float32))]
    meta = {"faiss": faiss.__version__, "factory": factory, "k": "10", "nprobe": ",".join(map(str, NPROBES[name]))}
    write_safetensors(os.path.join(OUT, f"{name}.expected.safetensors"), tensors, meta)


def read_tensor(path, name, dtype):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    b, e = header[name]["data_offsets"]
    return np.frombuffer(data[b:e], dtype=dtype).reshape(header[name]["shape"])


def recall(found, exact):
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


def build(tool, flat_path, factory, out):
    subprocess.run([tool, "build", "--from", flat_path, "--type", factory, "--out", out, "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ours_against_faiss(tool, tmp, flat_path, factory, xb, q, nprobes, compare_search):
    """Recall@10 of our build and of faiss's; with compare_search, faiss's search of our file
    against ours."""
    out = os.path.join(tmp, "ours.index")
    build(tool, flat_path, factory, out)
    ours = faiss.read_index(out)
    ref = faiss.index_factory(xb.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    ref.train(xb)
    ref.add(xb)
    exact = faiss.IndexFlatIP(xb.shape[1])
    exact.add(xb)
    _, E = exact.search(q, 10)
    row = {"read_index": type(ours).__name__,
           "quantizer": type(faiss.downcast_index(ours.quantizer)).__name__,
           "ntotal": int(ours.ntotal), "nlist": int(ours.nlist), "nprobe": int(ours.nprobe),
           "by_residual": bool(ours.by_residual), "M": int(ours.pq.M), "nbits": int(ours.pq.nbits),
           "vectors": int(xb.shape[0]), "queries": int(q.shape[0])}
    qpath = os.path.join(tmp, "q.safetensors")
    write_safetensors(qpath, [("queries", q)])
    for p in nprobes:
        ours.nprobe = p
        ref.nprobe = p
        D, I = ours.search(q, 10)
        _, R = ref.search(q, 10)
        cell = {"recall10_ours": recall(I, E), "recall10_faiss": recall(R, E)}
        if compare_search:
            res = os.path.join(tmp, "res.safetensors")
            subprocess.run([tool, "search", "--index", out, "--queries", qpath, "--k", "10",
                            "--nprobe", str(p), "--out", res], check=True, stdout=subprocess.DEVNULL)
            ids = read_tensor(res, "ids", "<i8")
            scores = read_tensor(res, "scores", "<f4")
            cell["queries_where_faiss_search_differs_from_ours"] = int(np.sum(np.any(I != ids, axis=1)))
            cell["max_score_difference"] = float(np.max(np.abs(D - scores)))
        row[f"nprobe{p}"] = cell
    return row


def low_rank_unit_rows(rng, n, d, basis):
    """faiss_bench.py's law: unit vectors near a random low-rank subspace, plus noise."""
    r = basis.shape[0]
    x = rng.standard_normal((n, r), dtype=np.float32) @ basis
    x += rng.standard_normal((n, d), dtype=np.float32) * np.float32(np.sqrt(0.1 * r))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def ivf_check(tool, xb, q):
    result = {"faiss": faiss.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        result["IVF16,PQ8 flat-ip"] = ours_against_faiss(
            tool, tmp, os.path.join(OUT, "flat-ip.index"), "IVF16,PQ8", xb, q, [1, 4, 16], True)
        rng = np.random.default_rng(0)
        basis = rng.standard_normal((16, 64), dtype=np.float32)
        big = low_rank_unit_rows(rng, 20000, 64, basis)
        bq = low_rank_unit_rows(rng, 500, 64, basis)
        flat = faiss.IndexFlatIP(64)
        flat.add(big)
        big_path = os.path.join(tmp, "big-flat.index")
        faiss.write_index(flat, big_path)
        result["IVF64,PQ16 low-rank"] = ours_against_faiss(
            tool, tmp, big_path, "IVF64,PQ16", big, bq, [1, 4, 16, 64], True)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", required=True, help="searchr1-index executable")
    args = ap.parse_args()
    xb = vectors_of("flat-ip")
    q = read_expected_queries("flat-ip")
    ivfpq_case("ivfpq-ip", "IVF16,PQ8", faiss.METRIC_INNER_PRODUCT, xb, q)
    ivfpq_case("ivfpq-l2", "IVF8,PQ8x4", faiss.METRIC_L2, vectors_of("flat-l2"), read_expected_queries("flat-l2"))
    check = ivf_check(args.index_tool, xb, q)
    with open(os.path.join(OUT, "ivf-check.json"), "w") as f:
        f.write(json.dumps(check, indent=2) + "\n")
    print(json.dumps(check))


if __name__ == "__main__":
    main()
