#!/usr/bin/env python3
"""The Xapian side of `npm run bench:bm25` (bench/bm25/run.ts runs it; see there).

  xapian_bench.py check
  xapian_bench.py build --corpus FILE.jsonl --db DIR --stopwords a,an,... [--stemmer porter]
  xapian_bench.py query --db DIR --queries FILE --stopwords ... [--topk 3,10] [--batch 64]
                        [--warmup N] [--processes N] [--repeat N]

Each mode prints one JSON object on stdout; progress goes to stderr. Timed query passes
are repeated (--repeat) and the median pass (by its total time) is reported.

Set-up, as close to searchr1's index as Xapian allows:
  - TermGenerator with Stem("porter") (Porter's original algorithm, as searchr1's
    `stemmer` package; "english" would be Snowball's Porter2), STEM_ALL (only stemmed
    terms, no unstemmed "Z"-less copies), Lucene's stop words with STOP_ALL (neither
    indexed nor counted in the document length);
  - index_text_without_positions: searchr1 stores no positions either;
  - DB_NO_TERMLIST: no per-document term lists (searchr1 has no forward index);
  - the document data is the row's byte offset in the corpus, as searchr1 reads rows
    in place through corpus.offsets;
  - DB_NO_SYNC: no fsync at commit (searchr1 does not fsync);
  - the database is compacted after the build (timed apart), as for a read-only index;
  - BM25Weight(k1=0.9, k2=0, k3=1, b=0.4, min_normlen=0);
  - queries parsed by QueryParser (same stemmer, stopper, STEM_ALL, default op OR).
Xapian indexes and searches in one thread; "query" runs sequentially in one process,
or with --processes N, in N processes that each open the database.
"""

import argparse
import json
import os
import shutil
import sys
import time

try:
    import xapian
except ImportError:
    print("xapian_bench.py: the Python module 'xapian' is missing "
          "(Debian/Ubuntu: apt-get install -y python3-xapian)", file=sys.stderr)
    sys.exit(3)

K1, K2, K3, B, MIN_NORMLEN = 0.9, 0.0, 1.0, 0.4, 0.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def stopper_of(words):
    stopper = xapian.SimpleStopper()
    for w in words:
        stopper.add(w)
    return stopper


def as_str(s):
    return s.decode() if isinstance(s, bytes) else s


def cmd_check(_args):
    languages = as_str(xapian.Stem.get_available_languages()).split()
    print(json.dumps({"xapian": as_str(xapian.version_string()), "python": sys.version.split()[0],
                      "porter": "porter" in languages}))


def cmd_build(args):
    if "XAPIAN_FLUSH_THRESHOLD" not in os.environ:
        os.environ["XAPIAN_FLUSH_THRESHOLD"] = str(args.flush)
    stopper = stopper_of(args.stopwords.split(","))
    tg = xapian.TermGenerator()
    tg.set_stemmer(xapian.Stem(args.stemmer))
    tg.set_stemming_strategy(xapian.TermGenerator.STEM_ALL)
    tg.set_stopper(stopper)
    tg.set_stopper_strategy(xapian.TermGenerator.STOP_ALL)
    flags = xapian.DB_CREATE_OR_OVERWRITE | xapian.DB_NO_SYNC | xapian.DB_NO_TERMLIST
    started = time.perf_counter()
    db = xapian.WritableDatabase(args.db, flags)
    docs = 0
    offset = 0
    loads = json.loads
    with open(args.corpus, "rb") as f:
        for line in f:
            at = offset
            offset += len(line)
            if not line.strip():
                continue
            doc = xapian.Document()
            tg.set_document(doc)
            tg.index_text_without_positions(loads(line)["contents"])
            doc.set_data(str(at))
            db.add_document(doc)
            docs += 1
            if docs % 200_000 == 0:
                log(f"  xapian: indexed {docs:,} passages ({time.perf_counter() - started:.0f} s)")
    db.commit()
    stats = {"documents": db.get_doccount(), "avg_length": db.get_avlength()}
    db.close()
    seconds = time.perf_counter() - started
    # Compact into a fresh database (full B-tree blocks, merged posting chunks): what
    # Xapian recommends for a database that is built once and then only searched; it
    # halves the size and speeds up queries.
    started = time.perf_counter()
    compacted = args.db + ".compact"
    shutil.rmtree(compacted, ignore_errors=True)
    xapian.Database(args.db).compact(compacted)
    shutil.rmtree(args.db)
    os.rename(compacted, args.db)
    compact_seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "compact_seconds": compact_seconds, "passages": docs,
                      "flush_threshold": int(os.environ["XAPIAN_FLUSH_THRESHOLD"]), **stats}))


class Searcher:
    """One database, enquire and query parser: searches one query at a time."""

    def __init__(self, db_path, stopwords, stemmer):
        self.db = xapian.Database(db_path)
        self.enquire = xapian.Enquire(self.db)
        self.enquire.set_weighting_scheme(xapian.BM25Weight(K1, K2, K3, B, MIN_NORMLEN))
        self.stopper = stopper_of(stopwords)
        qp = xapian.QueryParser()
        qp.set_stemmer(xapian.Stem(stemmer))
        qp.set_stemming_strategy(xapian.QueryParser.STEM_ALL)
        qp.set_stopper(self.stopper)
        qp.set_default_op(xapian.Query.OP_OR)
        qp.set_database(self.db)
        self.qp = qp

    def search(self, text, topk):
        self.enquire.set_query(self.qp.parse_query(text))
        return [m.docid - 1 for m in self.enquire.get_mset(0, topk)]


_worker = None


def _init_worker(db_path, stopwords, stemmer):
    global _worker
    _worker = Searcher(db_path, stopwords, stemmer)


def _run_batch(job):
    queries, topk = job
    for q in queries:
        _worker.search(q, topk)
    return len(queries)


def cmd_query(args):
    with open(args.queries, encoding="utf-8") as f:
        queries = [line.rstrip("\n") for line in f]
    stopwords = args.stopwords.split(",")
    topks = [int(k) for k in args.topk.split(",")]
    out = {"queries": len(queries), "batch": args.batch, "processes": args.processes,
           "single": {}, "batched": {}}
    clock = time.perf_counter

    def median_pass(run):
        passes = sorted((run() for _ in range(args.repeat)), key=lambda p: p["seconds"])
        return passes[len(passes) // 2]

    if args.processes > 1:
        import multiprocessing as mp
        batches = [queries[i:i + args.batch] for i in range(0, len(queries), args.batch)]
        ctx = mp.get_context("fork")
        with ctx.Pool(args.processes, _init_worker, (args.db, stopwords, args.stemmer)) as pool:
            # warm every process (and the page cache) before timing
            pool.map(_run_batch, [(b, max(topks)) for b in batches], chunksize=1)
            for k in topks:
                def run():
                    t = clock()
                    done = sum(pool.map(_run_batch, [(b, k) for b in batches], chunksize=1))
                    secs = clock() - t
                    return {"seconds": secs, "qps": done / secs}
                out["batched"][str(k)] = median_pass(run)
        print(json.dumps(out))
        return

    s = Searcher(args.db, stopwords, args.stemmer)
    for q in queries[:args.warmup]:
        s.search(q, max(topks))
    for k in topks:
        def single():
            lat = []
            top = []
            t0 = clock()
            for q in queries:
                t = clock()
                ids = s.search(q, k)
                lat.append((clock() - t) * 1000)
                top.append(ids)
            secs = clock() - t0
            return {"seconds": secs, "qps": len(queries) / secs, "latency_ms": lat, "top": top}

        def batched():
            # the same engine, one batch of queries after another, in this process
            t0 = clock()
            for i in range(0, len(queries), args.batch):
                for q in queries[i:i + args.batch]:
                    s.search(q, k)
            secs = clock() - t0
            return {"seconds": secs, "qps": len(queries) / secs}

        p = median_pass(single)
        top = p.pop("top")
        if k == max(topks):
            out["top"] = top
        out["single"][str(k)] = p
        out["batched"][str(k)] = median_pass(batched)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("check")
    b = sub.add_parser("build")
    b.add_argument("--corpus", required=True)
    b.add_argument("--db", required=True)
    b.add_argument("--stopwords", required=True)
    b.add_argument("--stemmer", default="porter")
    b.add_argument("--flush", type=int, default=100_000,
                   help="XAPIAN_FLUSH_THRESHOLD (documents per flush) unless set in the environment")
    q = sub.add_parser("query")
    q.add_argument("--db", required=True)
    q.add_argument("--queries", required=True)
    q.add_argument("--stopwords", required=True)
    q.add_argument("--stemmer", default="porter")
    q.add_argument("--topk", default="3,10")
    q.add_argument("--batch", type=int, default=64)
    q.add_argument("--warmup", type=int, default=200)
    q.add_argument("--processes", type=int, default=1)
    q.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    {"check": cmd_check, "build": cmd_build, "query": cmd_query}[args.mode](args)


if __name__ == "__main__":
    main()
