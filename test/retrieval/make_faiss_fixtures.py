"""Generate faiss reference fixtures for the native dense index (native/src/index/).

Run from the repository root with faiss and numpy (pip's faiss-cpu or Debian's
python3-faiss):

    python3 -m venv /work/venv-faiss && /work/venv-faiss/bin/pip install faiss-cpu numpy
    /work/venv-faiss/bin/python test/retrieval/make_faiss_fixtures.py [--index-tool native/build/searchr1-index]

It (re)writes, under test/retrieval/fixtures/faiss/:

  flat-ip.index        IndexFlatIP,   1200 x 64, rows 7 and 1100 identical (a tie)
  flat-l2.index        IndexFlatL2,   1000 x 32
  hnsw-ip.index        IndexHNSWFlat, 1500 x 32, M=16, inner product (Search-R1's HNSW64 kind)
  hnsw-l2.index        IndexHNSWFlat, 1000 x 16, M=8,  L2
  small-ip.index       IndexFlatIP,    100 x 64: what faiss writes for small.vectors
  small.vectors.safetensors   those 100 vectors (F32 [100, 64]): our writer must produce
                              small-ip.index byte for byte from them
  <name>.expected.safetensors per index: `queries` (F32 [nq, d]) and faiss's results,
      flat: `k<K>.ids` (I64 [nq, K]) and `k<K>.scores` (F32 [nq, K]);
      hnsw: `ef<E>.k<K>.ids` / `ef<E>.k<K>.scores` (efSearch E set on the index);
      __metadata__: faiss version, k (and ef) values, efSearch stored in the file.
  writer-check.json    with --index-tool: our writer's file for small.vectors read back
                       by faiss.read_index (same ntotal, d, metric, vectors, search results)

All vectors are random Gaussian rows normalised to unit length (as e5 embeddings are).
The CI has no Python: the tests run from these committed files. Output is deterministic
for a given faiss version (fixed seeds; searches run single-threaded).
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import faiss
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "faiss")
faiss.omp_set_num_threads(1)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, np.ndarray of float32 or int64)."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        dtype = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}[a.dtype]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def unit_rows(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def queries_for(rng, xb, nq):
    """Random unit queries, plus two that are database rows (exact matches at the top)."""
    q = unit_rows(rng, nq, xb.shape[1])
    q[0] = xb[7]
    q[1] = xb[len(xb) // 2]
    return q


def flat_case(name, index, xb, q, ks):
    index.add(xb)
    faiss.write_index(index, os.path.join(OUT, f"{name}.index"))
    tensors = [("queries", q)]
    for k in ks:
        D, I = index.search(q, k)
        tensors += [(f"k{k}.ids", I.astype(np.int64)), (f"k{k}.scores", D.astype(np.float32))]
    meta = {"faiss": faiss.__version__, "k": ",".join(map(str, ks))}
    write_safetensors(os.path.join(OUT, f"{name}.expected.safetensors"), tensors, meta)


def hnsw_case(name, d, m, metric, xb, q, efs, ks):
    index = faiss.IndexHNSWFlat(d, m, metric)
    index.hnsw.efConstruction = 40
    index.add(xb)
    index.hnsw.efSearch = 24  # stored in the file: the default a reader must use
    faiss.write_index(index, os.path.join(OUT, f"{name}.index"))
    exact = faiss.IndexFlat(d, metric)
    exact.add(xb)
    tensors = [("queries", q)]
    recalls = {}
    for ef in efs:
        index.hnsw.efSearch = ef
        for k in ks:
            D, I = index.search(q, k)
            tensors += [(f"ef{ef}.k{k}.ids", I.astype(np.int64)), (f"ef{ef}.k{k}.scores", D.astype(np.float32))]
            _, E = exact.search(q, k)
            recalls[f"ef{ef}.k{k}"] = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(I, E)]))
    # the efSearch stored in the file, searched without an override
    index = faiss.read_index(os.path.join(OUT, f"{name}.index"))
    D, I = index.search(q, 10)
    tensors += [("file.k10.ids", I.astype(np.int64)), ("file.k10.scores", D.astype(np.float32))]
    meta = {"faiss": faiss.__version__, "ef": ",".join(map(str, efs)), "k": ",".join(map(str, ks)),
            "file_ef_search": 24, "recall_vs_exact": json.dumps(recalls)}
    write_safetensors(os.path.join(OUT, f"{name}.expected.safetensors"), tensors, meta)


def writer_check(tool, xb, q):
    """Our writer's IndexFlatIP file, read by faiss: same header, vectors and results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ours.index")
        subprocess.run([tool, "write", "--vectors", os.path.join(OUT, "small.vectors.safetensors"),
                        "--out", out], check=True)
        ours = faiss.read_index(out)
        ref = faiss.read_index(os.path.join(OUT, "small-ip.index"))
        same_bytes = open(out, "rb").read() == open(os.path.join(OUT, "small-ip.index"), "rb").read()
        D1, I1 = ours.search(q, 10)
        D2, I2 = ref.search(q, 10)
        return {
            "faiss": faiss.__version__,
            "read_index": type(ours).__name__,
            "ntotal": int(ours.ntotal), "d": int(ours.d), "metric": int(ours.metric_type),
            "vectors_equal": bool(np.array_equal(faiss.rev_swig_ptr(ours.get_xb(), ours.ntotal * ours.d),
                                                 xb.reshape(-1))),
            "search_equal": bool(np.array_equal(I1, I2) and np.array_equal(D1, D2)),
            "bytes_equal_to_faiss_file": same_bytes,
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-tool", help="searchr1-index executable: also check our writer with faiss")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20)

    xb = unit_rows(rng, 1200, 64)
    xb[1100] = xb[7]  # a duplicated passage: two rows with bitwise equal scores
    flat_case("flat-ip", faiss.IndexFlatIP(64), xb, queries_for(rng, xb, 40), [1, 10, 64])

    xb = unit_rows(rng, 1000, 32)
    flat_case("flat-l2", faiss.IndexFlatL2(32), xb, queries_for(rng, xb, 40), [1, 10, 64])

    xb = unit_rows(rng, 1500, 32)
    hnsw_case("hnsw-ip", 32, 16, faiss.METRIC_INNER_PRODUCT, xb, queries_for(rng, xb, 40),
              [8, 16, 64], [1, 10, 32])
    xb = unit_rows(rng, 1000, 16)
    hnsw_case("hnsw-l2", 16, 8, faiss.METRIC_L2, xb, queries_for(rng, xb, 40), [8, 16, 64], [1, 10, 32])

    xb = unit_rows(rng, 100, 64)
    write_safetensors(os.path.join(OUT, "small.vectors.safetensors"), [("vectors", xb)])
    q = queries_for(rng, xb, 8)
    flat_case("small-ip", faiss.IndexFlatIP(64), xb, q, [5, 120])  # k > ntotal: -1 ids

    if args.index_tool:
        result = writer_check(args.index_tool, xb, q)
        with open(os.path.join(OUT, "writer-check.json"), "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        if not all(result[k] for k in ("vectors_equal", "search_equal", "bytes_equal_to_faiss_file")):
            sys.exit("writer check failed")


if __name__ == "__main__":
    main()
