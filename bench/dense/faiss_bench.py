#!/usr/bin/env python3
"""The faiss side of `npm run bench:dense` (bench/dense/run.ts runs it; see there).

  faiss_bench.py check
  faiss_bench.py make --work DIR --vectors N --dim D --queries Q --seed S
                      [--data uniform|low-rank] [--rank R] [--hnsw-m M --ef-construction E]
                      --threads T
  faiss_bench.py membw [--mib M]
  faiss_bench.py flat --index FILE --queries FILE --k K --threads T --single N --batch B
                      [--batched N] [--repeat R] [--budget S] [--mmap] [--blas-threshold N]
  faiss_bench.py search --index FILE --queries FILE --k K --threads T --batch B
                      [--ef LIST | --nprobe LIST] [--refine FILE --k-factor F]
                      [--single N] [--batched N] [--repeat R] [--budget S]
  faiss_bench.py build --from FILE --type TYPE --out FILE --threads T [--ef-construction E]

check   prints {"faiss", "numpy", "python", "blas_threshold" (faiss's
        distance_compute_blas_threshold: from how many queries per call IndexFlat searches
        with sgemm instead of one SIMD scan per query), "openblas" (the config string of the
        OpenBLAS that faiss's wheel bundles, with the kernel set it picked for this CPU; null
        when there is none)} as JSON.
make    the benchmark's inputs in DIR, each only when missing: N database vectors and Q
        queries, unit length, float32, drawn by numpy's default_rng(S) (the database first,
        then the queries) from one of two distributions. uniform: i.i.d. standard normal
        components, scaled to unit length (uniform on the sphere: every vector nearly
        orthogonal to every other, graph indexes' worst case). low-rank (default): z @ A +
        noise, scaled to unit length, with A a fixed R x D standard normal matrix (default
        R = 32), z standard normal in R dimensions and isotropic normal noise carrying about
        a tenth of the energy (variance 0.1 R per component against R for z @ A): points
        near an R-dimensional subspace, as learned embeddings are (their intrinsic dimension
        is far below D), so that nearest neighbours stand out and HNSW reaches useful
        recall. Writes the database as a faiss IndexFlatIP file with faiss.write_index
        (flat.index) and as faiss's CPU fp16 flat index, IndexScalarQuantizer(D, QT_fp16,
        METRIC_INNER_PRODUCT) (sq-fp16.index); the queries as a safetensors file with one F32 [Q, D] tensor
        'queries' (queries.safetensors); and with --hnsw-m an IndexHNSWFlat(D, M,
        METRIC_INNER_PRODUCT) with efConstruction E built by faiss on T threads over the
        same vectors (hnsw-M<M>-efc<E>.index). Prints {"flat", "queries", "sq_fp16", "hnsw",
        "hnsw_build_seconds" (null when the file was already there), "seconds"}.
membw   the machine's memory bandwidth as a plain copy sees it: np.copyto between two
        M-MiB float32 arrays (default 512), one thread, best of 5 after one untimed copy.
        Prints {"bytes", "seconds", "copy_gbps"} (bytes copied per second, 1e9 bytes; each
        byte is read once and written once).
flat    (any flat index: IndexFlatIP, IndexScalarQuantizer) faiss.read_index(FILE) (the
        whole file into memory; with --mmap, IO_FLAG_MMAP_IFC: faiss's own memory-mapped flat
        codes; a faiss without it prints {"skipped": why} instead), faiss.omp_set_num_threads(T), with --blas-threshold faiss's
        distance_compute_blas_threshold set to N, then: one untimed call of B queries
        (warm-up); batch 1: the first N queries one index.search call each, each timed;
        batch B: the first --batched queries (default all; 0: none) in slices of B, up to R
        timed passes, no new pass once S seconds (default 20) have gone by; the median pass
        is reported. Prints {"load_seconds", "rss" (VmRSS/RssAnon/RssFile in bytes:
        "start" after the imports, "loaded" after read_index, "searched" at the end),
        "single": {"seconds", "latency_ms"}, "batched": {"seconds", "latency_ms" (per call),
        "passes"} (null when --batched 0), "ids" (the top K of the batched queries, from the last pass)}.
search  the same for any index file, for each efSearch of LIST (comma-separated; an HNSW
        file: index.hnsw.efSearch = E) or each nprobe (an IVF file: nprobe = P; neither: the
        file as it is, reported under "-"): batch 1 over the first N queries (default: all;
        0: none) and batch B over all, R passes each. With --refine, the index is wrapped in
        faiss's IndexRefine over the flat file FILE (read into memory) with k_factor F: the
        top k·F candidates rescored exactly. Prints {"rss", "by": {"E": {"single", "batched",
        "ids"}}}.
build   index_factory(d, TYPE, METRIC_INNER_PRODUCT) over the vectors of the IndexFlatIP file
        FILE (read whole before the clock starts), on T threads, with efConstruction E for the
        HNSW types (faiss's default 40 otherwise): train, add, write_index to OUT, each
        timed. Prints {"type" (faiss's class), "train_seconds", "add_seconds",
        "write_seconds", "seconds" (the three), "bytes" (OUT's size)}.
All timings are time.perf_counter() around the index.search calls.

Exit status 3 when faiss or numpy cannot be imported.
"""

import argparse
import json
import os
import platform
import sys
import time

try:
    import faiss
    import numpy as np
except ImportError as err:
    print(f"faiss_bench.py: {err} (needs faiss-cpu and numpy: pip install faiss-cpu numpy)",
          file=sys.stderr)
    sys.exit(3)


def rss():
    """VmRSS, RssAnon and RssFile of this process, in bytes."""
    out = {}
    with open("/proc/self/status", encoding="utf8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def write_safetensors(path, name, array):
    """One little-endian tensor, as the format says: u64 header length, JSON, then data."""
    dtype = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}[array.dtype]
    header = json.dumps({name: {"dtype": dtype, "shape": list(array.shape),
                                "data_offsets": [0, array.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        f.write(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())
    os.replace(tmp, path)


def read_queries(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    info = header["queries"]
    assert info["dtype"] == "F32", info
    begin, end = info["data_offsets"]
    return np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy()


def unit_rows(rng, n, d, basis=None):
    """n unit vectors: uniform on the sphere, or (with basis, R x d) near its row space."""
    if basis is None:
        x = rng.standard_normal((n, d), dtype=np.float32)
    else:
        r = basis.shape[0]
        x = rng.standard_normal((n, r), dtype=np.float32) @ basis
        x += rng.standard_normal((n, d), dtype=np.float32) * np.float32(np.sqrt(0.1 * r))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def bundled_openblas():
    """The config string of the OpenBLAS in faiss's wheel (faiss_cpu.libs), or None."""
    try:
        import ctypes
        import glob
        libs = os.path.join(os.path.dirname(os.path.dirname(faiss.__file__)), "faiss_cpu.libs")
        found = glob.glob(os.path.join(libs, "libopenblas*"))
        if not found:
            return None
        lib = ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
        lib.openblas_get_config.restype = ctypes.c_char_p
        return lib.openblas_get_config().decode()
    except (OSError, AttributeError):
        return None


def cmd_check(_args):
    print(json.dumps({"faiss": faiss.__version__, "numpy": np.__version__,
                      "python": platform.python_version(),
                      "blas_threshold": faiss.cvar.distance_compute_blas_threshold,
                      "openblas": bundled_openblas()}))


def cmd_make(args):
    start = time.perf_counter()
    faiss.omp_set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    flat = os.path.join(args.work, "flat.index")
    queries = os.path.join(args.work, "queries.safetensors")
    sq = os.path.join(args.work, "sq-fp16.index")
    hnsw = (os.path.join(args.work, f"hnsw-M{args.hnsw_m}-efc{args.ef_construction}.index")
            if args.hnsw_m else None)
    need = [p for p in (flat, queries, sq, hnsw) if p and not os.path.exists(p)]
    build_seconds = None
    if need:
        rng = np.random.default_rng(args.seed)
        basis = (rng.standard_normal((args.rank, args.dim), dtype=np.float32)
                 if args.data == "low-rank" else None)
        x = unit_rows(rng, args.vectors, args.dim, basis)
        q = unit_rows(rng, args.queries, args.dim, basis)
        if not os.path.exists(queries):
            write_safetensors(queries, "queries", q)
        if not os.path.exists(flat):
            index = faiss.IndexFlatIP(args.dim)
            index.add(x)
            faiss.write_index(index, flat + ".tmp")
            os.replace(flat + ".tmp", flat)
            del index
        if not os.path.exists(sq):
            index = faiss.IndexScalarQuantizer(args.dim, faiss.ScalarQuantizer.QT_fp16,
                                               faiss.METRIC_INNER_PRODUCT)
            index.add(x)
            faiss.write_index(index, sq + ".tmp")
            os.replace(sq + ".tmp", sq)
            del index
        if hnsw and not os.path.exists(hnsw):
            index = faiss.IndexHNSWFlat(args.dim, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = args.ef_construction
            t = time.perf_counter()
            index.add(x)
            build_seconds = time.perf_counter() - t
            faiss.write_index(index, hnsw + ".tmp")
            os.replace(hnsw + ".tmp", hnsw)
    print(json.dumps({"flat": flat, "queries": queries, "sq_fp16": sq, "hnsw": hnsw,
                      "hnsw_build_seconds": build_seconds,
                      "seconds": time.perf_counter() - start}))


def cmd_membw(args):
    n = args.mib * (1 << 20) // 4
    a = np.ones(n, dtype=np.float32)
    b = np.zeros(n, dtype=np.float32)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    print(json.dumps({"bytes": a.nbytes, "seconds": best, "copy_gbps": a.nbytes / best / 1e9}))


def time_single(index, q, k, n):
    lat = []
    t0 = time.perf_counter()
    for i in range(min(n, len(q))):
        t = time.perf_counter()
        index.search(q[i:i + 1], k)
        lat.append((time.perf_counter() - t) * 1000)
    return {"seconds": time.perf_counter() - t0, "latency_ms": lat}


def time_batched(index, q, k, batch, repeat, budget):
    """Up to `repeat` passes over q in slices of `batch`; the median pass by its time."""
    passes = []
    start = time.perf_counter()
    for _ in range(repeat):
        if passes and time.perf_counter() - start > budget:
            break
        lat, parts = [], []
        for i in range(0, len(q), batch):
            t = time.perf_counter()
            _, ii = index.search(q[i:i + batch], k)
            lat.append((time.perf_counter() - t) * 1000)
            parts.append(ii)
        passes.append((sum(lat) / 1000, lat, parts))
    passes.sort(key=lambda p: p[0])
    seconds, lat, parts = passes[(len(passes) - 1) // 2]
    return ({"seconds": seconds, "latency_ms": lat, "passes": [p[0] for p in passes]},
            np.concatenate(parts))


def cmd_flat(args):
    if args.mmap and not hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        # faiss.read_index maps flat codes from faiss 1.8.0 on (impl/io.h, IO_FLAG_MMAP_IFC).
        print(json.dumps({"skipped": f"faiss {faiss.__version__} has no IO_FLAG_MMAP_IFC "
                                     "(faiss >= 1.8.0 maps flat codes)"}))
        return
    faiss.omp_set_num_threads(args.threads)
    if args.blas_threshold:
        faiss.cvar.distance_compute_blas_threshold = args.blas_threshold
    q = read_queries(args.queries)
    mem = {"start": rss()}
    t = time.perf_counter()
    index = faiss.read_index(args.index, faiss.IO_FLAG_MMAP_IFC if args.mmap else 0)
    load = time.perf_counter() - t
    mem["loaded"] = rss()
    index.search(q[:args.batch], args.k)  # warm-up
    single = time_single(index, q, args.k, args.single)
    batched, ids = None, []
    nb = len(q) if args.batched is None else args.batched
    if nb > 0:
        batched, ids = time_batched(index, q[:nb], args.k, args.batch, args.repeat,
                                       args.budget)
        ids = ids.tolist()
    mem["searched"] = rss()
    print(json.dumps({"load_seconds": load, "rss": mem, "single": single, "batched": batched,
                      "ids": ids}))


def cmd_search(args):
    faiss.omp_set_num_threads(args.threads)
    q = read_queries(args.queries)
    mem = {"start": rss()}
    index = faiss.read_index(args.index)
    mem["loaded"] = rss()
    searched = index
    if args.refine:
        searched = faiss.IndexRefine(index, faiss.read_index(args.refine))
        searched.k_factor = args.k_factor
    settings = [("-", None)]
    if args.ef:
        settings = [(e, lambda v: setattr(index.hnsw, "efSearch", v)) for e in args.ef.split(",")]
    elif args.nprobe:
        ivf = faiss.extract_index_ivf(index)
        settings = [(p, lambda v: setattr(ivf, "nprobe", v)) for p in args.nprobe.split(",")]
    out = {}
    for value, apply in settings:
        if apply:
            apply(int(value))
        searched.search(q[:args.batch], args.k)  # warm-up
        single = time_single(searched, q, args.k, len(q) if args.single is None else args.single)
        nb = len(q) if args.batched is None else args.batched
        batched, ids = time_batched(searched, q[:nb], args.k, args.batch, args.repeat,
                                       args.budget)
        out[value] = {"single": single, "batched": batched, "ids": ids.tolist()}
    mem["searched"] = rss()
    print(json.dumps({"rss": mem, "by": out}))


def cmd_build(args):
    faiss.omp_set_num_threads(args.threads)
    src = faiss.read_index(args.from_)
    x = faiss.rev_swig_ptr(src.get_xb(), src.ntotal * src.d).reshape(src.ntotal, src.d)
    index = faiss.index_factory(src.d, args.type, faiss.METRIC_INNER_PRODUCT)
    if hasattr(index, "hnsw"):
        index.hnsw.efConstruction = args.ef_construction
    t = time.perf_counter()
    index.train(x)
    train = time.perf_counter() - t
    t = time.perf_counter()
    index.add(x)
    add = time.perf_counter() - t
    t = time.perf_counter()
    faiss.write_index(index, args.out + ".tmp")
    os.replace(args.out + ".tmp", args.out)
    write = time.perf_counter() - t
    print(json.dumps({"type": type(index).__name__, "train_seconds": train, "add_seconds": add,
                      "write_seconds": write, "seconds": train + add + write,
                      "bytes": os.path.getsize(args.out)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    m = sub.add_parser("make")
    m.add_argument("--work", required=True)
    m.add_argument("--vectors", type=int, required=True)
    m.add_argument("--dim", type=int, required=True)
    m.add_argument("--queries", type=int, required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--data", choices=("uniform", "low-rank"), default="low-rank")
    m.add_argument("--rank", type=int, default=32)
    m.add_argument("--hnsw-m", type=int, default=0)
    m.add_argument("--ef-construction", type=int, default=40)
    m.add_argument("--threads", type=int, default=os.cpu_count())
    b = sub.add_parser("membw")
    b.add_argument("--mib", type=int, default=512)
    for name in ("flat", "search"):
        s = sub.add_parser(name)
        s.add_argument("--index", required=True)
        s.add_argument("--queries", required=True)
        s.add_argument("--k", type=int, default=10)
        s.add_argument("--threads", type=int, default=os.cpu_count())
        s.add_argument("--single", type=int, default=0 if name == "flat" else None)
        s.add_argument("--batch", type=int, default=64)
        s.add_argument("--batched", type=int, default=None)
        s.add_argument("--repeat", type=int, default=3)
        s.add_argument("--budget", type=float, default=20.0)
        if name == "flat":
            s.add_argument("--mmap", action="store_true")
            s.add_argument("--blas-threshold", type=int, default=0)
        else:
            s.add_argument("--ef")
            s.add_argument("--nprobe")
            s.add_argument("--refine")
            s.add_argument("--k-factor", type=int, default=4)
    b = sub.add_parser("build")
    b.add_argument("--from", dest="from_", required=True)
    b.add_argument("--type", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--ef-construction", type=int, default=40)
    b.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    {"check": cmd_check, "make": cmd_make, "membw": cmd_membw, "flat": cmd_flat,
     "search": cmd_search, "build": cmd_build}[args.cmd](args)


if __name__ == "__main__":
    main()
