// faiss's VisitedTable (faiss/impl/VisitedTable.h): a mark per node, cleared lazily by
// bumping the mark value, so that a graph walk of a few hundred nodes does not clear a table
// of ntotal marks. Used by the HNSW search (hnsw_search.cpp) and build (hnsw_build.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace sr1 {

class Visited {
 public:
  explicit Visited(int64_t n) : marks_(n, 0) {}
  // Marks node i; true when it was not marked yet.
  bool set(int32_t i) {
    if (marks_[i] == mark_) return false;
    marks_[i] = mark_;
    return true;
  }
  int64_t size() const { return int64_t(marks_.size()); }
  void next_query() {
    if (++mark_ == 250) {  // faiss's limit too; then really clear
      std::fill(marks_.begin(), marks_.end(), 0);
      mark_ = 1;
    }
  }

 private:
  std::vector<uint8_t> marks_;
  uint8_t mark_ = 1;
};

}  // namespace sr1
