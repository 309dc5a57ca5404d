#include "engine/block_manager.h"

#include <algorithm>

#include "util/error.h"

namespace sr1 {

BlockManager::BlockManager(int num_blocks, int block_size)
    : block_size_(block_size), blocks_(num_blocks) {
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; b--) free_.push_back(b);  // hands out 0, 1, ... first
}

uint64_t BlockManager::hash(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over the parent hash and the token ids, then a final avalanche (splitmix64).
  uint64_t h = 0xcbf29ce484222325ULL ^ parent;
  for (int i = 0; i < block_size_; i++) {
    uint32_t t = static_cast<uint32_t>(tokens[i]);
    for (int k = 0; k < 4; k++, t >>= 8) h = (h ^ (t & 0xff)) * 0x100000001b3ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

int BlockManager::acquire_cached(uint64_t parent, uint64_t h, const int32_t* tokens) {
  const auto it = table_.find(h);
  if (it == table_.end()) return -1;
  Block& b = blocks_[it->second];
  if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), tokens)) return -1;
  if (b.refs == 0) lru_.erase(b.lru);
  b.refs++;
  return it->second;
}

int BlockManager::allocate() {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.pop_front();
    unpublish(id);
  } else {
    return -1;
  }
  blocks_[id].refs = 1;
  return id;
}

void BlockManager::release(int block) {
  Block& b = blocks_[block];
  if (b.refs <= 0) throw Error("engine: block " + std::to_string(block) + " released twice");
  if (--b.refs > 0) return;
  if (b.published) {
    b.lru = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

void BlockManager::publish(int block, uint64_t parent, uint64_t h, const int32_t* tokens) {
  Block& b = blocks_[block];
  if (b.published || table_.count(h) != 0) return;
  b.published = true;
  b.hash = h;
  b.parent = parent;
  b.tokens.assign(tokens, tokens + block_size_);
  table_[h] = block;
}

void BlockManager::unpublish(int block) {
  Block& b = blocks_[block];
  if (!b.published) return;
  table_.erase(b.hash);
  b.published = false;
  b.tokens.clear();
}

void BlockManager::flush() {
  for (int id : lru_) {
    unpublish(id);
    free_.push_back(id);
  }
  lru_.clear();
}

}  // namespace sr1
