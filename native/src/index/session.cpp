#include "index/session.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "index/flat_search.h"
#include "index/hnsw_search.h"
#include "index/ivf_pq.h"
#include "index/rescore.h"
#include "util/error.h"

namespace sr1 {

const FaissIndex& IndexSession::searched() const {
  if (!index) throw Error("no index is open (start serve with --index)");
  return *index;
}

BertEncoder& IndexSession::bert() const {
  if (!encoder) throw Error("no encoder is loaded (start serve with --model)");
  return *encoder;
}

BertEncoder& IndexSession::cross_encoder() const {
  if (!reranker) throw Error("no reranker is loaded (start serve with --reranker)");
  return *reranker;
}

void check_search_options(const FaissIndex* index, bool ef_search, bool nprobe, bool exact) {
  const std::string what =
      index ? index->path + " is " + index_type_name(*index) : std::string("no --index was given");
  if (ef_search && !(index && index->has_hnsw)) {
    throw UsageError("--ef-search applies to HNSW indexes; " + what);
  }
  if (nprobe && !(index && index->ivf)) {
    throw UsageError("--nprobe applies to IVF indexes; " + what);
  }
  if (exact && index && index->ivf) {
    throw UsageError("--exact applies to an HNSW file's vectors; " + what +
                     " (PQ codes, no exact vectors: rescore from the Flat file with "
                     "--rescore-from)");
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using TokenRows = std::vector<std::vector<int32_t>>;

// `key`: a list of non-empty lists of token ids, each one a text the encoder can take, each
// id in 0..limit-1 (the vocabulary; for token types, type_vocab_size).
TokenRows read_token_rows(const JsonFields& f, const char* key, const BertConfig& c, int limit) {
  const json::Value& v = f.required(key);
  if (!v.is_array()) throw Error(std::string("'") + key + "' must be a list of lists of token ids");
  TokenRows rows;
  rows.reserve(v.as_array().size());
  for (size_t i = 0; i < v.as_array().size(); i++) {
    const json::Value& row = v.as_array()[i];
    const std::string at = key + ("[" + std::to_string(i) + "]");
    if (!row.is_array()) throw Error(at + ": must be a list of token ids");
    const json::Value::Array& ids = row.as_array();
    if (ids.empty()) throw Error(at + ": no tokens");
    if (ids.size() > static_cast<size_t>(c.max_position_embeddings)) {
      throw Error(at + ": " + std::to_string(ids.size()) + " tokens, more than the encoder's " +
                  "max_position_embeddings (" + std::to_string(c.max_position_embeddings) + ")");
    }
    std::vector<int32_t>& out = rows.emplace_back();
    out.reserve(ids.size());
    for (size_t j = 0; j < ids.size(); j++) {
      const std::string here = at + "[" + std::to_string(j) + "]";
      if (!ids[j].is_integer()) throw Error(here + ": not an integer token id");
      const int64_t id = ids[j].as_int();
      if (id < 0 || id >= limit) {
        throw Error(here + ": " + (limit == c.vocab_size ? "token id " : "token type ") +
                    std::to_string(id) + " outside " +
                    (limit == c.vocab_size ? "the vocabulary" : "type_vocab_size") + " (0.." +
                    std::to_string(limit - 1) + ")");
      }
      out.push_back(static_cast<int32_t>(id));
    }
  }
  return rows;
}

// `vectors`: a list of lists of d numbers, returned as one row-major matrix.
std::vector<float> read_vectors(const JsonFields& f, int d) {
  const json::Value& v = f.required("vectors");
  if (!v.is_array()) throw Error("'vectors' must be a list of lists of numbers");
  std::vector<float> out;
  out.reserve(v.as_array().size() * static_cast<size_t>(d));
  for (size_t i = 0; i < v.as_array().size(); i++) {
    const json::Value& row = v.as_array()[i];
    const std::string at = "vectors[" + std::to_string(i) + "]";
    if (!row.is_array()) throw Error(at + ": must be a list of numbers");
    if (row.as_array().size() != static_cast<size_t>(d)) {
      throw Error(at + ": " + std::to_string(row.as_array().size()) +
                  " numbers, but the index holds vectors of d = " + std::to_string(d));
    }
    for (size_t j = 0; j < row.as_array().size(); j++) {
      const json::Value& x = row.as_array()[j];
      if (!x.is_number()) throw Error(at + "[" + std::to_string(j) + "]: not a number");
      out.push_back(static_cast<float>(x.as_number()));
    }
  }
  return out;
}

// Runs `run(first, B, T)` over the rows sorted by length and cut into micro-batches of at
// most batch_tokens padded tokens (one row at least), so that short texts are not padded to
// long ones and the encoder's activations stay bounded; `order[first..first+B)` are the
// batch's rows, the longest last, whose length T is the batch's width.
template <typename Run>
void for_each_batch(const IndexSession& s, const TokenRows& rows, std::vector<size_t>& order,
                    Run run) {
  order.resize(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].size() < rows[b].size(); });
  for (size_t first = 0, last = 0; first < order.size(); first = last) {
    // Rows only grow longer: the last one taken sets the batch's width.
    last = first + 1;
    while (last < order.size() &&
           static_cast<int64_t>((last + 1 - first) * rows[order[last]].size()) <= s.batch_tokens) {
      last++;
    }
    run(first, static_cast<int>(last - first), rows[order[last - 1]].size());
  }
}

// Pads the batch's rows of `rows` (and `more`, rows of the same lengths, when given) into
// B x T matrices with their mask.
void pad_batch(const TokenRows& rows, const TokenRows* more, const size_t* order, int B,
               size_t T, std::vector<int32_t>& ids, std::vector<int32_t>& extra,
               std::vector<int32_t>& mask) {
  ids.assign(B * T, 0);
  extra.assign(more != nullptr ? B * T : 0, 0);
  mask.assign(B * T, 0);
  for (int b = 0; b < B; b++) {
    const std::vector<int32_t>& row = rows[order[b]];
    std::copy(row.begin(), row.end(), ids.begin() + b * T);
    if (more != nullptr) std::copy((*more)[order[b]].begin(), (*more)[order[b]].end(), extra.begin() + b * T);
    std::fill_n(mask.begin() + b * T, row.size(), 1);
  }
}

// Embeddings [rows, dim] of token rows, each back in its row's place.
std::vector<float> encode_rows(const IndexSession& s, const TokenRows& rows) {
  BertEncoder& bert = s.bert();
  const size_t dim = static_cast<size_t>(bert.dim());
  std::vector<float> out(rows.size() * dim), pooled;
  std::vector<int32_t> ids, none, mask;
  std::vector<size_t> order;
  for_each_batch(s, rows, order, [&](size_t first, int B, size_t T) {
    pad_batch(rows, nullptr, order.data() + first, B, T, ids, none, mask);
    pooled.resize(B * dim);
    bert.encode(ids.data(), mask.data(), B, static_cast<int>(T), s.pooling, s.normalize,
                pooled.data());
    for (int b = 0; b < B; b++) {
      std::copy_n(pooled.data() + b * dim, dim, out.data() + order[first + b] * dim);
    }
  });
  return out;
}

json::Value info(const IndexSession& s) {
  json::Value encoder;
  if (s.encoder) {
    const BertConfig& c = s.encoder->config();
    encoder = json::Value::object({{"dim", s.encoder->dim()},
                                   {"vocab_size", c.vocab_size},
                                   {"max_position_embeddings", c.max_position_embeddings},
                                   {"pooling", s.pooling_name},
                                   {"normalize", s.normalize}});
  }
  json::Value r = json::Value::object(
      {{"index", s.index ? index_info_json(*s.index) : json::Value()},
       {"encoder", encoder},
       {"fp16", s.index && (s.index->vectors_f16 != nullptr || s.gpu != nullptr)}});
  if (s.reranker) {  // only then, as index_device below
    const BertConfig& c = s.reranker->config();
    r.set("reranker", json::Value::object({{"dim", c.hidden_size},
                                           {"layers", c.num_layers},
                                           {"vocab_size", c.vocab_size},
                                           {"type_vocab_size", c.type_vocab_size},
                                           {"max_position_embeddings", c.max_position_embeddings}}));
  }
  const bool graph = s.index && s.index->has_hnsw && !s.exact && !s.gpu;
  r.set("ef_search", graph ? json::Value(s.ef_search) : json::Value());
  r.set("nprobe", s.index && s.index->ivf ? json::Value(s.nprobe) : json::Value());
  json::Value rescore;
  if (s.rescore) {
    rescore = json::Value::object({{"path", s.rescore->path},
                                   {"type", index_type_name(*s.rescore)},
                                   {"candidates", s.rescore_candidates}});
  }
  r.set("rescore", rescore);
  if (s.gpu) {  // only then, so that the reply of a CPU index stays as it was
    json::Value gpus = json::Value::array();
    for (const CudaShardInfo& shard : s.gpu->shards()) {
      gpus.push(json::Value::object({{"gpu", shard.gpu},
                                     {"name", shard.name},
                                     {"first", shard.first},
                                     {"rows", shard.rows},
                                     {"bytes", static_cast<int64_t>(shard.bytes)}}));
    }
    r.set("index_device", "cuda");
    r.set("gpus", gpus);
  }
  return r;
}

json::Value search(const IndexSession& s, const JsonFields& f) {
  const FaissIndex& index = s.searched();
  const int64_t k = f.integer("k");
  if (k < 1) throw Error("'k' must be >= 1");
  if (!f.has("input_ids") && !f.has("vectors")) throw Error("'input_ids' or 'vectors' is missing");
  if (f.has("input_ids") && f.has("vectors")) {
    throw Error("'input_ids' and 'vectors' exclude each other (texts to encode, or their vectors)");
  }
  std::vector<float> queries;
  double encode_seconds = 0;
  if (f.has("input_ids")) {
    const TokenRows rows = read_token_rows(f, "input_ids", s.bert().config(), s.bert().config().vocab_size);
    const auto start = Clock::now();
    queries = encode_rows(s, rows);
    encode_seconds = seconds_since(start);
  } else {
    queries = read_vectors(f, index.d);
  }
  const int nq = static_cast<int>(queries.size() / index.d);
  // Places beyond ntotal would only be empty ones, which the reply leaves out.
  const int kept = static_cast<int>(std::min<int64_t>(k, index.ntotal));
  const auto start = Clock::now();
  TopK r;
  if (s.gpu && kept > kCudaFlatMaxK) {
    throw Error("'k' must be <= " + std::to_string(kCudaFlatMaxK) + " with the index on the GPU");
  }
  // With --rescore-from the index gives k * rescore_candidates candidates, which the Flat
  // file scores exactly (an HNSW walk still stops by efSearch: SERVE.md, --rescore-from).
  int wanted = kept;
  if (s.rescore) {
    const int64_t candidates = int64_t{kept} * s.rescore_candidates;
    wanted = static_cast<int>(std::min<int64_t>(candidates, index.ntotal));
    if (s.gpu) wanted = std::max(kept, std::min(wanted, kCudaFlatMaxK));
  }
  if (nq > 0 && kept > 0) {
    r = s.gpu                         ? s.gpu->search(queries.data(), nq, wanted)
        : index.ivf                   ? ivfpq_search(index, queries.data(), nq, wanted, s.nprobe)
        : index.has_hnsw && !s.exact ? hnsw_search(index, queries.data(), nq, wanted, s.ef_search)
                                      : flat_search(index, queries.data(), nq, wanted);
    if (s.rescore) r = rescore(*s.rescore, queries.data(), r, kept);
  }
  const double search_seconds = seconds_since(start);
  json::Value ids = json::Value::array(), scores = json::Value::array();
  for (int q = 0; q < nq; q++) {
    json::Value qi = json::Value::array(), qs = json::Value::array();
    for (int j = 0; j < kept; j++) {
      const size_t at = static_cast<size_t>(q) * kept + j;
      if (r.ids[at] < 0) break;  // empty places (an HNSW beam too narrow) come last
      qi.push(r.ids[at]);
      qs.push(static_cast<double>(r.scores[at]));
    }
    ids.push(std::move(qi));
    scores.push(std::move(qs));
  }
  return json::Value::object({{"ids", ids},
                              {"scores", scores},
                              {"encode_seconds", encode_seconds},
                              {"search_seconds", search_seconds}});
}

// The cross-encoder's score of each (query, passage) pair: `input_ids` and `token_type_ids`
// as the tokenizer makes them for a pair, row by row of the same lengths.
json::Value rerank(const IndexSession& s, const JsonFields& f) {
  BertEncoder& model = s.cross_encoder();
  const BertConfig& c = model.config();
  const TokenRows rows = read_token_rows(f, "input_ids", c, c.vocab_size);
  const TokenRows types = read_token_rows(f, "token_type_ids", c, c.type_vocab_size);
  if (types.size() != rows.size()) {
    throw Error("'token_type_ids' has " + std::to_string(types.size()) + " rows but 'input_ids' " +
                std::to_string(rows.size()));
  }
  for (size_t i = 0; i < rows.size(); i++) {
    if (types[i].size() != rows[i].size()) {
      throw Error("token_type_ids[" + std::to_string(i) + "]: " + std::to_string(types[i].size()) +
                  " types for " + std::to_string(rows[i].size()) + " tokens");
    }
  }
  const auto start = Clock::now();
  std::vector<float> scores(rows.size()), logits;
  std::vector<int32_t> ids, type, mask;
  std::vector<size_t> order;
  for_each_batch(s, rows, order, [&](size_t first, int B, size_t T) {
    pad_batch(rows, &types, order.data() + first, B, T, ids, type, mask);
    logits.resize(B);  // one label (checked at start)
    model.classify(ids.data(), type.data(), mask.data(), B, static_cast<int>(T), logits.data());
    for (int b = 0; b < B; b++) scores[order[first + b]] = logits[b];
  });
  json::Value out = json::Value::array();
  for (float x : scores) out.push(static_cast<double>(x));
  return json::Value::object({{"scores", out}, {"seconds", seconds_since(start)}});
}

json::Value build_open(IndexSession& s, const JsonFields& f) {
  const int dim = s.bert().dim();
  const std::string path = f.text("path"), metric = f.text("metric", "ip");
  if (metric != "ip" && metric != "l2") {
    throw Error("'metric' must be \"ip\" or \"l2\", got \"" + metric + "\"");
  }
  s.build.reset();  // a build left open is closed (its file stays) before this one opens
  s.build = FlatIndexWriter::resume(path, dim, metric == "l2" ? Metric::L2 : Metric::InnerProduct);
  s.build->sync();
  return json::Value::object({{"rows", s.build->ntotal()}});
}

json::Value build_append(IndexSession& s, const JsonFields& f) {
  if (!s.build) throw Error("no build is open (send build_open first)");
  const auto start = Clock::now();
  const TokenRows rows = read_token_rows(f, "input_ids", s.bert().config(), s.bert().config().vocab_size);
  const std::vector<float> embeddings = encode_rows(s, rows);
  try {
    s.build->append(embeddings.data(), static_cast<int64_t>(rows.size()));
    s.build->sync();
  } catch (const Error& e) {
    // The file may now end inside a row the writer has not counted: start again from it.
    s.build.reset();
    throw Error(std::string(e.what()) +
                "; the build is closed (build_open resumes it from its whole rows)");
  }
  return json::Value::object({{"rows", s.build->ntotal()}, {"seconds", seconds_since(start)}});
}

json::Value build_commit(IndexSession& s, const JsonFields& f) {
  if (!s.build) throw Error("no build is open (send build_open first)");
  const std::string out = f.text("out");
  const std::unique_ptr<FlatIndexWriter> build = std::move(s.build);  // closed either way
  build->commit(out);
  return json::Value::object(
      {{"rows", build->ntotal()}, {"bytes", static_cast<int64_t>(build->bytes())}});
}

// Each op's fields besides "op" and "id": anything else is refused, so that a misspelt
// field never goes unnoticed.
const std::vector<std::pair<std::string, std::vector<std::string>>> kOps = {
    {"info", {}},
    {"search", {"k", "input_ids", "vectors"}},
    {"rerank", {"input_ids", "token_type_ids"}},
    {"build_open", {"path", "metric"}},
    {"build_append", {"input_ids"}},
    {"build_commit", {"out"}},
    {"shutdown", {}}};

void check_fields(const std::string& op, const JsonFields& f) {
  std::string list;
  for (const auto& [name, fields] : kOps) {
    if (name == op) {
      std::vector<std::string> known = {"op", "id"};
      known.insert(known.end(), fields.begin(), fields.end());
      f.only(known);
      return;
    }
    list += (list.empty() ? "" : ", ") + name;
  }
  throw Error("unknown op '" + op + "' (" + list + ")");
}

}  // namespace

json::Value handle_command(IndexSession& s, const std::string& op, const JsonFields& f) {
  check_fields(op, f);
  if (op == "info") return info(s);
  if (op == "search") return search(s, f);
  if (op == "rerank") return rerank(s, f);
  if (op == "build_open") return build_open(s, f);
  if (op == "build_append") return build_append(s, f);
  return build_commit(s, f);
}

}  // namespace sr1
