// Constrained decoding: a context-free grammar over bytes that a sequence's output must
// follow (SGLang's `json_schema`, `regex` and `ebnf`, OpenAI's `response_format` and
// `tool_choice` "required" or a named function; the TypeScript side compiles those into this
// grammar, src/engine/grammar/).
//
// A grammar is a graph of five kinds of node: a literal byte string, a byte class repeated
// between min and max times, a sequence, a choice, and a repetition of one node. Nodes may
// refer back to earlier ones (a JSON value inside an array inside a value), as long as no
// node reaches itself without consuming a byte first (left recursion), which parse_grammar
// refuses.
//
// GrammarState is where a sequence is in its grammar: the set of parse stacks still alive
// after the bytes so far (a nondeterministic pushdown recognizer). Stacks are persistent
// linked lists, so a step shares everything below the top frame with the stacks it came
// from, and a repetition without an upper bound stops counting at its minimum, so the state
// inside a long string or number repeats exactly (TokenMasks caches masks by state).
#pragma once
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/json.h"

namespace sr1 {

struct GrammarNode {
  enum Kind { Lit, Class, Seq, Alt, Rep } kind = Lit;
  std::string text;            // Lit: the bytes
  std::bitset<256> bytes;      // Class: the bytes it takes
  std::vector<int> items;      // Seq, Alt: the parts; Rep: one, the repeated node
  int min = 0, max = -1;       // Class, Rep: how many times (max -1: unbounded)
};

struct Grammar {
  std::vector<GrammarNode> nodes;
  int start = 0;
};

// Reads {"start": i, "nodes": [...]} where each node is one of
//   {"lit": "text"}, {"class": [[lo, hi], ...], "min": m, "max": n},
//   {"seq": [i, ...]}, {"alt": [i, ...]}, {"rep": i, "min": m, "max": n}
// (max -1 or absent: unbounded). Throws sr1::Error naming the node and field that is wrong,
// a node index out of range, an empty choice, a repetition of a node that can match no
// bytes, or left recursion.
Grammar parse_grammar(const json::Value& v);

class GrammarState {
 public:
  // Most parse stacks one state may hold. An ambiguous grammar (anyOf of overlapping schemas
  // inside a recursion, say) can double them at each byte; past this the state throws
  // sr1::Error rather than eat the engine's time and memory.
  static constexpr size_t kMaxStacks = 256;
  // The state before any byte.
  explicit GrammarState(std::shared_ptr<const Grammar> grammar);
  // The state after `byte`; dead() when the grammar cannot take it here.
  GrammarState after(uint8_t byte) const;
  // After each of `bytes` in turn (stops early once dead).
  GrammarState after(const std::string& bytes) const;
  bool dead() const { return ready_.empty() && !accepts_; }
  // The bytes so far are a whole sentence of the grammar.
  bool accepts() const { return accepts_; }
  // The bytes that some stack can take next.
  const std::bitset<256>& next_bytes() const { return next_; }
  // Equal states have equal keys (a hash of the set of stacks, in any order).
  uint64_t key() const { return key_; }
  // The same set of stacks (and the same ending), whatever their order.
  bool operator==(const GrammarState& o) const;

  struct Frame;
  struct Stack;
  using StackPtr = std::shared_ptr<const Stack>;

 private:
  GrammarState(std::shared_ptr<const Grammar> grammar, std::vector<StackPtr> ready, bool accepts);
  std::shared_ptr<const Grammar> g_;
  // The stacks whose top frame takes a byte next (a literal or a byte class); the empty
  // stack (the whole grammar matched) is kept as accepts_ instead.
  std::vector<StackPtr> ready_;
  bool accepts_ = false;
  std::bitset<256> next_;
  uint64_t key_ = 0;
};

}  // namespace sr1
