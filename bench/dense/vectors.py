"""What the dense recall benchmarks (serve_recall.py, ef_construction.py, ivf_recall.py)
share: the options sizing their data; the data, faiss_bench.py's low-rank vectors (unit
vectors near a random 32-dimensional subspace plus isotropic noise, as learned embeddings
are) with queries from the same law, not in the database; their exact inner-product top 10
(faiss IndexFlatIP) and the flat file the builds start from; recall@k against those.
"""

import os

import faiss
import numpy as np

from faiss_bench import unit_rows


def add_set_arguments(ap, n):
    """The set's size options, in the scripts' order: --n (default n), --dim, --queries."""
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=500)


def low_rank_set(n, dim, queries, work):
    """(x, q, flat_path, exact): n database vectors and `queries` queries of dim, drawn with
    seed 0; the flat index of x written to work/flat.index; the exact top-10 ids of q."""
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((32, dim), dtype=np.float32)
    x = unit_rows(rng, n, dim, basis)
    q = unit_rows(rng, queries, dim, basis)
    flat = faiss.IndexFlatIP(dim)
    flat.add(x)
    flat_path = os.path.join(work, "flat.index")
    faiss.write_index(flat, flat_path)
    _, exact = flat.search(q, 10)
    return x, q, flat_path, exact


def recall(found, exact, k):
    """The mean share of each query's exact top k that its first k found ids hold."""
    return float(np.mean([len(set(f[:k]) & set(e[:k].tolist())) / k for f, e in zip(found, exact)]))
