// Which tokens keep a sequence's output inside its grammar (engine/grammar.h): the
// vocabulary's byte strings as a trie, walked from the sequence's grammar state so that a
// whole subtree of tokens is dropped at the first byte the grammar refuses.
//
// The states met on the way are kept as a lazily built automaton (a state's transition on a
// byte is computed once), so the walk itself is table lookups, and the mask of a state is
// kept for when the state comes back (inside a string or a number each token leads back to
// the same state).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar.h"

namespace sr1 {

class VocabTrie {
 public:
  // token_bytes[id]: the bytes token `id` decodes to; empty: the token never appears inside
  // a grammar's text (special tokens). `vocab`: the model's vocabulary size (ids past
  // token_bytes never appear either).
  VocabTrie(const std::vector<std::string>& token_bytes, int vocab);
  int vocab() const { return vocab_; }
  const std::string& bytes(int32_t id) const;

  // Nodes in preorder; node 0 is the root. A node's children are the nodes from i + 1 up to
  // end[i], each child's subtree ending where the next begins.
  struct Node {
    uint8_t byte = 0;
    int end = 0;
    int tok_begin = 0, tok_end = 0;  // the tokens spelt by the path to this node, in tokens_
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  int vocab_;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
};

class TokenMasks {
 public:
  TokenMasks(std::shared_ptr<const VocabTrie> trie, std::shared_ptr<const Grammar> grammar);

  // The tokens whose bytes the grammar takes next, as bits over the vocabulary (bit id % 64
  // of word id / 64). End-of-sequence tokens are not among them: see accepts().
  const std::vector<uint64_t>& allowed();
  // The output so far is a whole sentence of the grammar (it may end here).
  bool accepts() const { return states_[current_].accepts(); }
  // Moves past a generated token's bytes; false when the grammar cannot take them.
  bool advance(int32_t token);

 private:
  int intern(GrammarState s);
  int next(int state, uint8_t byte);
  void walk(int node, int state, std::vector<uint64_t>& mask);

  std::shared_ptr<const VocabTrie> trie_;
  std::vector<GrammarState> states_;
  std::vector<std::array<int32_t, 256>> moves_;  // -2: not computed yet, -1: refused
  std::unordered_map<uint64_t, std::vector<int>> by_key_;
  int current_ = 0;
  std::unordered_map<int, std::vector<uint64_t>> masks_;
};

}  // namespace sr1
