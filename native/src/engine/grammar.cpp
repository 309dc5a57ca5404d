#include "engine/grammar.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "util/error.h"

namespace sr1 {

// ---- the grammar ----

namespace {

std::string node_name(size_t i) { return "grammar: node " + std::to_string(i); }

int count_field(const json::Value& node, const char* key, int fallback, size_t i) {
  const json::Value* v = node.find(key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_integer() || v->as_int() < -1 || v->as_int() > INT32_MAX) {
    throw Error(node_name(i) + ": '" + key + "' must be an integer >= -1");
  }
  return static_cast<int>(v->as_int());
}

int index_of(const json::Value& v, size_t n, size_t i) {
  if (!v.is_integer() || v.as_int() < 0 || static_cast<size_t>(v.as_int()) >= n) {
    throw Error(node_name(i) + ": a node index must be an integer in [0, " + std::to_string(n) +
                ")");
  }
  return static_cast<int>(v.as_int());
}

std::vector<int> index_list(const json::Value& v, size_t n, size_t i, const char* key) {
  if (!v.is_array() || v.as_array().empty()) {
    throw Error(node_name(i) + ": '" + key + "' must be a non-empty list of node indices");
  }
  std::vector<int> out;
  for (const json::Value& x : v.as_array()) out.push_back(index_of(x, n, i));
  return out;
}

GrammarNode parse_node(const json::Value& v, size_t n, size_t i) {
  if (!v.is_object()) throw Error(node_name(i) + " must be an object");
  GrammarNode g;
  if (const json::Value* t = v.find("lit")) {
    if (!t->is_string()) throw Error(node_name(i) + ": 'lit' must be a string");
    g.kind = GrammarNode::Lit;
    g.text = t->as_string();
  } else if (const json::Value* c = v.find("class")) {
    g.kind = GrammarNode::Class;
    if (!c->is_array()) throw Error(node_name(i) + ": 'class' must be a list of [lo, hi] ranges");
    for (const json::Value& r : c->as_array()) {
      const bool ok = r.is_array() && r.as_array().size() == 2 && r.as_array()[0].is_integer() &&
                      r.as_array()[1].is_integer();
      const int64_t lo = ok ? r.as_array()[0].as_int() : -1;
      const int64_t hi = ok ? r.as_array()[1].as_int() : -1;
      if (!ok || lo < 0 || hi > 255 || lo > hi) {
        throw Error(node_name(i) + ": 'class' ranges must be [lo, hi] with 0 <= lo <= hi <= 255");
      }
      for (int64_t b = lo; b <= hi; b++) g.bytes.set(static_cast<size_t>(b));
    }
  } else if (const json::Value* s = v.find("seq")) {
    g.kind = GrammarNode::Seq;
    g.items = index_list(*s, n, i, "seq");
  } else if (const json::Value* a = v.find("alt")) {
    g.kind = GrammarNode::Alt;
    g.items = index_list(*a, n, i, "alt");
  } else if (const json::Value* r = v.find("rep")) {
    g.kind = GrammarNode::Rep;
    g.items = {index_of(*r, n, i)};
  } else {
    throw Error(node_name(i) + " must have one of 'lit', 'class', 'seq', 'alt', 'rep'");
  }
  if (g.kind == GrammarNode::Class || g.kind == GrammarNode::Rep) {
    g.min = count_field(v, "min", 0, i);
    g.max = count_field(v, "max", -1, i);
    if (g.min < 0) throw Error(node_name(i) + ": 'min' must be >= 0");
    if (g.max != -1 && g.max < std::max(g.min, 1)) {
      throw Error(node_name(i) + ": 'max' must be -1 (unbounded) or at least 'min' and 1");
    }
  }
  return g;
}

// Which nodes can match no bytes at all (a fixpoint over the graph).
std::vector<bool> nullable_nodes(const Grammar& g) {
  std::vector<bool> null(g.nodes.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < g.nodes.size(); i++) {
      if (null[i]) continue;
      const GrammarNode& n = g.nodes[i];
      bool v = false;
      switch (n.kind) {
        case GrammarNode::Lit: v = n.text.empty(); break;
        case GrammarNode::Class: v = n.min == 0; break;
        case GrammarNode::Seq:
          v = std::all_of(n.items.begin(), n.items.end(), [&](int k) { return null[k]; });
          break;
        case GrammarNode::Alt:
          v = std::any_of(n.items.begin(), n.items.end(), [&](int k) { return null[k]; });
          break;
        case GrammarNode::Rep: v = n.min == 0 || null[n.items[0]]; break;
      }
      if (v) null[i] = changed = true;
    }
  }
  return null;
}

// Refuses a node that reaches itself before any byte is consumed: the recognizer would push
// it forever.
void refuse_left_recursion(const Grammar& g, const std::vector<bool>& null) {
  const size_t n = g.nodes.size();
  std::vector<std::vector<int>> first(n);  // nodes that can start where node i starts
  for (size_t i = 0; i < n; i++) {
    const GrammarNode& node = g.nodes[i];
    if (node.kind == GrammarNode::Seq) {
      for (int k : node.items) {
        first[i].push_back(k);
        if (!null[k]) break;
      }
    } else if (node.kind == GrammarNode::Alt || node.kind == GrammarNode::Rep) {
      first[i] = node.items;
    }
  }
  std::vector<int> color(n, 0);  // 0 unseen, 1 on the path, 2 done
  std::function<void(int)> visit = [&](int i) {
    color[i] = 1;
    for (int k : first[i]) {
      if (color[k] == 1) throw Error(node_name(k) + " is left-recursive (it starts with itself)");
      if (color[k] == 0) visit(k);
    }
    color[i] = 2;
  };
  for (size_t i = 0; i < n; i++) {
    if (color[i] == 0) visit(static_cast<int>(i));
  }
}

}  // namespace

Grammar parse_grammar(const json::Value& v) {
  if (!v.is_object()) throw Error("grammar must be an object with 'start' and 'nodes'");
  const json::Value* nodes = v.find("nodes");
  if (nodes == nullptr || !nodes->is_array() || nodes->as_array().empty()) {
    throw Error("grammar: 'nodes' must be a non-empty list");
  }
  Grammar g;
  const size_t n = nodes->as_array().size();
  for (size_t i = 0; i < n; i++) g.nodes.push_back(parse_node(nodes->as_array()[i], n, i));
  const json::Value* start = v.find("start");
  if (start == nullptr) throw Error("grammar: 'start' is missing");
  if (!start->is_integer() || start->as_int() < 0 || static_cast<size_t>(start->as_int()) >= n) {
    throw Error("grammar: 'start' must be a node index in [0, " + std::to_string(n) + ")");
  }
  g.start = static_cast<int>(start->as_int());
  const std::vector<bool> null = nullable_nodes(g);
  for (size_t i = 0; i < n; i++) {
    if (g.nodes[i].kind == GrammarNode::Rep && null[g.nodes[i].items[0]]) {
      throw Error(node_name(i) + " repeats a node that can match no bytes");
    }
  }
  refuse_left_recursion(g, null);
  return g;
}

// ---- the recognizer ----

// Where a node is: Lit, the bytes matched; Class, the bytes taken; Seq, the next part;
// Rep, the parts matched. A Seq or Rep frame below a part already holds the count for after
// that part, so finishing a part is popping it.
struct GrammarState::Frame {
  int node = 0, pos = 0;
  bool operator==(const Frame& o) const { return node == o.node && pos == o.pos; }
};

struct GrammarState::Stack {
  Frame top;
  StackPtr below;
  uint64_t hash = 0;
};

namespace {

using Frame = GrammarState::Frame;
using Stack = GrammarState::Stack;
using StackPtr = GrammarState::StackPtr;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

StackPtr push(const Frame& f, StackPtr below) {
  auto s = std::make_shared<Stack>();
  const uint64_t frame = (static_cast<uint64_t>(f.node) << 32) | static_cast<uint32_t>(f.pos);
  s->hash = mix((below ? below->hash : 0x5bd1e995ull) ^ mix(frame));
  s->top = f;
  s->below = std::move(below);
  return s;
}

bool same(const Stack* a, const Stack* b) {
  while (a != nullptr && b != nullptr) {
    if (a == b) return true;
    if (a->hash != b->hash || !(a->top == b->top)) return false;
    a = a->below.get();
    b = b->below.get();
  }
  return a == b;
}

// A set of stacks, by hash then by content.
class StackSet {
 public:
  bool insert(const StackPtr& s) {
    std::vector<const Stack*>& bucket = by_hash_[s->hash];
    for (const Stack* t : bucket) {
      if (same(t, s.get())) return false;
    }
    bucket.push_back(s.get());
    return true;
  }

 private:
  std::unordered_map<uint64_t, std::vector<const Stack*>> by_hash_;
};

// Follows every way `s` can go without consuming a byte, collecting the stacks that wait
// for a byte (`ready`) and noting whether the grammar can end here.
class Closure {
 public:
  explicit Closure(const Grammar& g) : g_(g) {}

  void expand(const StackPtr& s) {
    if (s == nullptr) {
      accepts = true;
      return;
    }
    if (!seen_.insert(s)) return;
    const GrammarNode& n = g_.nodes[s->top.node];
    const int pos = s->top.pos;
    switch (n.kind) {
      case GrammarNode::Lit:
        if (pos < static_cast<int>(n.text.size())) {
          ready.push_back(s);
        } else {
          expand(s->below);
        }
        break;
      case GrammarNode::Class:
        if (n.max == -1 || pos < n.max) ready.push_back(s);
        if (pos >= n.min) expand(s->below);
        break;
      case GrammarNode::Seq:
        if (pos == static_cast<int>(n.items.size())) {
          expand(s->below);
        } else {
          expand(push(Frame{n.items[pos], 0}, push(Frame{s->top.node, pos + 1}, s->below)));
        }
        break;
      case GrammarNode::Alt:
        for (int item : n.items) expand(push(Frame{item, 0}, s->below));
        break;
      case GrammarNode::Rep:
        if (pos >= n.min) expand(s->below);
        if (n.max == -1 || pos < n.max) {
          // Unbounded: counts past the minimum behave alike, so they are not kept apart.
          const int next = n.max == -1 ? std::min(pos + 1, n.min) : pos + 1;
          expand(push(Frame{n.items[0], 0}, push(Frame{s->top.node, next}, s->below)));
        }
        break;
    }
  }

  std::vector<StackPtr> ready;
  bool accepts = false;

 private:
  const Grammar& g_;
  StackSet seen_;
};

}  // namespace

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  Closure c(*g_);
  c.expand(push(Frame{g_->start, 0}, nullptr));
  *this = GrammarState(g_, std::move(c.ready), c.accepts);
}

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar, std::vector<StackPtr> ready,
                           bool accepts)
    : g_(std::move(grammar)), ready_(std::move(ready)), accepts_(accepts) {
  if (ready_.size() > kMaxStacks) {
    throw Error("grammar: more than " + std::to_string(kMaxStacks) +
                " ways to parse the output so far (the grammar is too ambiguous)");
  }
  key_ = accepts_ ? 0x2545f4914f6cdd1dull : 0;
  for (const StackPtr& s : ready_) {
    key_ += mix(s->hash);  // a sum: the order of the stacks does not matter
    const GrammarNode& n = g_->nodes[s->top.node];
    if (n.kind == GrammarNode::Lit) {
      next_.set(static_cast<uint8_t>(n.text[s->top.pos]));
    } else {
      next_ |= n.bytes;
    }
  }
}

GrammarState GrammarState::after(uint8_t byte) const {
  Closure c(*g_);
  if (next_.test(byte)) {
    for (const StackPtr& s : ready_) {
      const GrammarNode& n = g_->nodes[s->top.node];
      const int pos = s->top.pos;
      if (n.kind == GrammarNode::Lit) {
        if (static_cast<uint8_t>(n.text[pos]) == byte) {
          c.expand(push(Frame{s->top.node, pos + 1}, s->below));
        }
      } else if (n.bytes.test(byte)) {
        const int next = n.max == -1 ? std::min(pos + 1, n.min) : pos + 1;
        c.expand(push(Frame{s->top.node, next}, s->below));
      }
    }
  }
  return GrammarState(g_, std::move(c.ready), c.accepts);
}

bool GrammarState::operator==(const GrammarState& o) const {
  if (key_ != o.key_ || accepts_ != o.accepts_ || ready_.size() != o.ready_.size()) return false;
  return std::all_of(ready_.begin(), ready_.end(), [&](const StackPtr& s) {
    return std::any_of(o.ready_.begin(), o.ready_.end(),
                       [&](const StackPtr& t) { return same(s.get(), t.get()); });
  });
}

GrammarState GrammarState::after(const std::string& bytes) const {
  GrammarState s = *this;
  for (char b : bytes) {
    if (s.dead()) break;
    s = s.after(static_cast<uint8_t>(b));
  }
  return s;
}

}  // namespace sr1
