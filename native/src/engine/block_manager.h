// Which KV-cache blocks hold what: reference counts, a free list, and the prefix cache.
//
// A full block (block_size positions) whose keys and values are computed can be published
// under the hash of its whole token prefix: hash(parent block's hash, its own tokens). A
// later sequence that starts with the same tokens takes references to the published blocks
// instead of recomputing them (vLLM's block hashing; reuse granularity = block_size). A
// block nobody references stays cached until its memory is needed; the least recently
// released goes first. Hash matches are verified against the stored tokens and parent
// hash, so only a collision of the 64-bit prefix hashes could give a wrong match.
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace sr1 {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  // Blocks that allocate() can hand out: free ones and cached ones nobody references.
  int available() const { return static_cast<int>(free_.size() + lru_.size()); }
  int used() const { return num_blocks() - available(); }
  int cached() const { return static_cast<int>(lru_.size()); }

  static constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ULL;
  // Hash of a block of tokens after the prefix whose last block hashed to `parent`.
  uint64_t hash(uint64_t parent, const int32_t* tokens) const;

  // The published block holding exactly `tokens` after `parent`, or -1. Takes a reference.
  int acquire_cached(uint64_t parent, uint64_t h, const int32_t* tokens);
  // Looks up without taking a reference.
  bool is_cached(uint64_t h) const { return table_.count(h) != 0; }
  // A block for new contents (reference count 1), evicting the least recently released
  // cached block when no block is free; -1 when every block is referenced.
  int allocate();
  // Drops one reference; at zero the block stays cached if published, else becomes free.
  void release(int block);
  // Publishes a full, computed block under hash `h` (no-op when that prefix is already
  // published by another block).
  void publish(int block, uint64_t parent, uint64_t h, const int32_t* tokens);
  // Forgets every published block nobody references (their memory becomes free).
  void flush();

 private:
  struct Block {
    int refs = 0;
    bool published = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;  // the published contents, for verification
    std::list<int>::iterator lru;
  };
  void unpublish(int block);

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int> free_;
  std::list<int> lru_;  // cached, unreferenced blocks; front = least recently released
  std::unordered_map<uint64_t, int> table_;
};

}  // namespace sr1
