// Exact rescoring of an approximate search's candidates (serve --rescore-from): each
// query's top candidates from any served index (an HNSW graph, scalar-quantizer codes, an
// fp16 copy) are scored again against the fp32 rows of a Flat file of the same vectors
// (IndexFlatIP / IndexFlatL2, memory-mapped and read only at the candidates' rows), and
// re-sorted, so the scores returned are the Flat file's exact ones and the top k are the
// exact top k of the candidates. This is what faiss's IndexRefine / IndexRefineFlat does
// (faiss/IndexRefine.cpp: k_factor * k candidates from the base index, then exact distances
// from the refine index), here with the Flat file kept on the disk rather than in memory.
#pragma once
#include <string>

#include "index/faiss_io.h"
#include "index/flat_search.h"

namespace sr1 {

// Refuses, naming `flag`, a `flat` file that cannot rescore `index`: not an IndexFlatIP /
// IndexFlatL2, another metric, or another vector count or d.
void check_rescore_file(const FaissIndex& index, const FaissIndex& flat, const std::string& flag);

// Advises the kernel that `flat`'s rows are read at random (no readahead): a rescore reads
// k_factor * k rows per query, anywhere in the file.
void prepare_rescore_file(const FaissIndex& flat);

// Each query's candidates (row q's candidates.k ids, -1 for an empty place) scored exactly
// against `flat` (inner product, or squared L2 distance, in fp32 as faiss's Flat search)
// and its best k kept and sorted as flat_search does (faiss's heap fed in id order, topk.h:
// equal scores listed inner product the higher id first, L2 the lower id first); -1 and the
// worst score fill the places of a query with fewer than k candidates. Queries run in
// parallel (OpenMP).
TopK rescore(const FaissIndex& flat, const float* queries, const TopK& candidates, int k);

}  // namespace sr1
