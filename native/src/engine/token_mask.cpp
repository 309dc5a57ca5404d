#include "engine/token_mask.h"

#include <algorithm>

#include "util/error.h"

namespace sr1 {

namespace {
// Bounds on what one sequence keeps: the automaton is started afresh from the current state
// past kMaxStates states, and the masks are dropped past kMaxMasks.
constexpr size_t kMaxStates = 1 << 14;
constexpr size_t kMaxMasks = 64;
}  // namespace

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes, int vocab)
    : vocab_(vocab), bytes_(token_bytes) {
  bytes_.resize(std::max<size_t>(bytes_.size(), static_cast<size_t>(vocab)));
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab; id++) {
    if (!bytes_[id].empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  // Sorted strings give the trie in preorder: each string shares its longest common prefix
  // with the one before, and what follows is new nodes.
  nodes_.push_back(Node{});
  std::vector<int> path = {0};  // path[d]: the node at depth d on the current branch
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    if (prev != nullptr) {
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) common++;
    }
    while (path.size() > common + 1) {
      nodes_[path.back()].end = static_cast<int>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); d++) {
      Node n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.tok_begin = n.tok_end = static_cast<int>(tokens_.size());
      path.push_back(static_cast<int>(nodes_.size()));
      nodes_.push_back(n);
    }
    // Equal strings are adjacent in the order, so a node's tokens are too.
    Node& last = nodes_[path.back()];
    tokens_.push_back(id);
    last.tok_end = static_cast<int>(tokens_.size());
    prev = &s;
  }
  for (int node : path) nodes_[node].end = static_cast<int>(nodes_.size());
}

const std::string& VocabTrie::bytes(int32_t id) const { return bytes_.at(static_cast<size_t>(id)); }

TokenMasks::TokenMasks(std::shared_ptr<const VocabTrie> trie,
                       std::shared_ptr<const Grammar> grammar)
    : trie_(std::move(trie)) {
  current_ = intern(GrammarState(std::move(grammar)));
}

int TokenMasks::intern(GrammarState s) {
  std::vector<int>& same_key = by_key_[s.key()];
  for (int i : same_key) {
    if (states_[i] == s) return i;
  }
  same_key.push_back(static_cast<int>(states_.size()));
  states_.push_back(std::move(s));
  std::array<int32_t, 256> unknown;
  unknown.fill(-2);
  moves_.push_back(unknown);
  return static_cast<int>(states_.size()) - 1;
}

int TokenMasks::next(int state, uint8_t byte) {
  int32_t& move = moves_[state][byte];
  if (move == -2) {
    if (!states_[state].next_bytes().test(byte)) {
      move = -1;
    } else {
      GrammarState s = states_[state].after(byte);
      const int to = s.dead() ? -1 : intern(std::move(s));
      moves_[state][byte] = to;  // `move` may dangle: intern grows moves_
    }
  }
  return moves_[state][byte];
}

void TokenMasks::walk(int node, int state, std::vector<uint64_t>& mask) {
  const std::vector<VocabTrie::Node>& nodes = trie_->nodes();
  const std::vector<int32_t>& tokens = trie_->tokens();
  for (int c = node + 1; c < nodes[node].end; c = nodes[c].end) {
    const int to = next(state, nodes[c].byte);
    if (to < 0) continue;
    for (int t = nodes[c].tok_begin; t < nodes[c].tok_end; t++) {
      mask[static_cast<size_t>(tokens[t]) / 64] |= uint64_t{1} << (tokens[t] % 64);
    }
    walk(c, to, mask);
  }
}

const std::vector<uint64_t>& TokenMasks::allowed() {
  const auto hit = masks_.find(current_);
  if (hit != masks_.end()) return hit->second;
  if (states_.size() > kMaxStates) {  // start the automaton afresh from where we are
    GrammarState now = states_[current_];
    states_.clear();
    moves_.clear();
    by_key_.clear();
    masks_.clear();
    current_ = intern(std::move(now));
  }
  if (masks_.size() >= kMaxMasks) masks_.clear();
  std::vector<uint64_t> mask((static_cast<size_t>(trie_->vocab()) + 63) / 64, 0);
  walk(0, current_, mask);
  return masks_[current_] = std::move(mask);
}

bool TokenMasks::advance(int32_t token) {
  const std::string& bytes = trie_->bytes(token);
  if (bytes.empty()) return false;
  int s = current_;
  for (char b : bytes) {
    s = next(s, static_cast<uint8_t>(b));
    if (s < 0) return false;
  }
  current_ = s;
  return true;
}

}  // namespace sr1
