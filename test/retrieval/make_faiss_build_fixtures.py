"""Fixtures for the faiss index types searchr1-index builds (native/src/index/faiss_write.h).

Run from the repository root with Debian's python3-faiss (1.7.3) or pip's faiss-cpu, after
make_faiss_fixtures.py made flat-ip.index (its 1200 x 64 inner-product vectors and its
queries are reused):

    /usr/bin/python3 test/retrieval/make_faiss_build_fixtures.py --index-tool /tmp/build/searchr1-index

It (re)writes, under test/retrieval/fixtures/faiss/:

  sq8-ip.index, sqfp16-ip.index, hnsw-sq8-ip.index
                       index_factory(64, "SQ8" / "SQfp16" / "HNSW16,SQ8", inner product)
                       trained and filled with flat-ip's vectors (efConstruction 40)
  <name>.expected.safetensors   `queries` (flat-ip's) and faiss's `k10.ids` / `k10.scores`
                       (hnsw-sq8-ip: `ef16.k10.*` and `ef64.k10.*`)
  build-check.json     `searchr1-index build --from flat-ip.index` of each type, read by
                       faiss.read_index: its class, whether the SQ files are byte for byte
                       faiss's, on how many queries faiss's search of our HNSW files returns other
                       lists than `searchr1-index search` does, and recall@10 against exact search of
                       our graph and of faiss's own at the same M and efConstruction
"""

import argparse
import json
import os
import struct
import subprocess
import tempfile

import faiss
import numpy as np

from make_faiss_fixtures import OUT, write_safetensors

def factory_case(name, factory, xb, q, efs=None):
    """A faiss index_factory index over xb, and its results (hnsw: at each efSearch)."""
    index = faiss.index_factory(xb.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if efs:
        index.hnsw.efConstruction = 40
    index.train(xb)
    index.add(xb)
    faiss.write_index(index, os.path.join(OUT, f"{name}.index"))
    tensors = [("queries", q)]
    for ef in efs or [None]:
        if ef:
            index.hnsw.efSearch = ef
        D, I = index.search(q, 10)
        prefix = f"ef{ef}.k10" if ef else "k10"
        tensors += [(f"{prefix}.ids", I.astype(np.int64)), (f"{prefix}.scores", D.astype(np.float32))]
    meta = {"faiss": faiss.__version__, "factory": factory, "k": "10"}
    if efs:
        meta["ef"] = ",".join(map(str, efs))
    write_safetensors(os.path.join(OUT, f"{name}.expected.safetensors"), tensors, meta)


def read_expected_queries(name):
    with open(os.path.join(OUT, f"{name}.expected.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    info = header["queries"]
    begin, end = info["data_offsets"]
    return np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy()


def build_check(tool, xb, q):
    """Our builder's files, read and searched by faiss."""
    flat = faiss.IndexFlatIP(xb.shape[1])
    flat.add(xb)
    _, exact = flat.search(q, 10)

    def recall(found):
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)]))

    result = {"faiss": faiss.__version__, "from": "flat-ip.index"}
    with tempfile.TemporaryDirectory() as tmp:
        qpath = os.path.join(tmp, "q.safetensors")
        write_safetensors(qpath, [("queries", q)])
        for factory in ["HNSW16", "HNSW16,SQ8", "SQ8", "SQfp16"]:
            out = os.path.join(tmp, "built.index")
            extra = ["--ef-construction", "40"] if factory.startswith("HNSW") else []
            subprocess.run([tool, "build", "--from", os.path.join(OUT, "flat-ip.index"), "--type", factory,
                            "--out", out, "--overwrite", "--threads", "1"] + extra, check=True,
                           stdout=subprocess.DEVNULL)
            ours = faiss.read_index(out)
            row = {"read_index": type(ours).__name__, "ntotal": int(ours.ntotal)}
            if not factory.startswith("HNSW"):
                ref = os.path.join(OUT, {"SQ8": "sq8-ip", "SQfp16": "sqfp16-ip"}[factory] + ".index")
                row["bytes_equal_to_faiss_file"] = open(out, "rb").read() == open(ref, "rb").read()
            else:
                ref = faiss.index_factory(xb.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
                ref.hnsw.efConstruction = 40
                ref.train(xb)
                ref.add(xb)
                for ef in (16, 64):
                    ours.hnsw.efSearch = ef
                    ref.hnsw.efSearch = ef
                    _, found = ours.search(q, 10)
                    _, theirs = ref.search(q, 10)
                    res = os.path.join(tmp, "res.safetensors")
                    subprocess.run([tool, "search", "--index", out, "--queries", qpath, "--k", "10",
                                    "--ef-search", str(ef), "--out", res], check=True,
                                   stdout=subprocess.DEVNULL)
                    with open(res, "rb") as f:
                        n = struct.unpack("<Q", f.read(8))[0]
                        header = json.loads(f.read(n))
                        data = f.read()
                    b, e = header["ids"]["data_offsets"]
                    searched = np.frombuffer(data[b:e], dtype="<i8").reshape(found.shape)
                    row[f"ef{ef}"] = {"queries": len(q),
                                      "queries_where_faiss_search_differs_from_ours":
                                          int(np.sum(np.any(found != searched, axis=1))),
                                      "queries_where_sets_differ":
                                          int(sum(set(a) != set(b) for a, b in zip(found, searched))),
                                      "recall10_our_graph": recall(found), "recall10_faiss_graph": recall(theirs)}
            result[factory] = row
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", required=True, help="searchr1-index executable")
    args = ap.parse_args()
    flat = faiss.read_index(os.path.join(OUT, "flat-ip.index"))
    xb = np.array(faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d)).reshape(flat.ntotal, flat.d)
    q = read_expected_queries("flat-ip")
    factory_case("sq8-ip", "SQ8", xb, q)
    factory_case("sqfp16-ip", "SQfp16", xb, q)
    factory_case("hnsw-sq8-ip", "HNSW16,SQ8", xb, q, [16, 64])
    built = build_check(args.index_tool, xb, q)
    with open(os.path.join(OUT, "build-check.json"), "w") as f:
        f.write(json.dumps(built, indent=2) + "\n")
    print(json.dumps(built))


if __name__ == "__main__":
    main()
