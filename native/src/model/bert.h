// A BERT-family text encoder (e5-base-v2's architecture: post-LayerNorm BERT with GELU,
// absolute position embeddings and token-type embeddings), forward only, for dense
// retrieval: token ids in, one L2-normalised embedding per text out, exactly as
// Search-R1's Encoder computes it (AutoModel's last_hidden_state, then mean pooling over
// the attention mask or the [CLS] row, then L2 normalisation). Loaded with its
// sequence-classification head, it is also a cross-encoder (reranker): transformers'
// BertForSequenceClassification, the logits of `[CLS] query [SEP] passage [SEP]` pairs, as
// sentence-transformers' CrossEncoder computes them before its activation.
//
// Written once against the Backend interface (backend/backend.h), like the Qwen2 model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

struct BertConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int max_position_embeddings = 0;
  int type_vocab_size = 0;
  float layer_norm_eps = 1e-12f;
  // transformers' PretrainedConfig.num_labels: the size of id2label (2 when config.json has
  // neither id2label nor num_labels). Only the classification head reads it.
  int num_labels = 2;
  int head_dim() const { return hidden_size / num_heads; }
};

// Reads `<dir>/config.json` (model_type "bert", hidden_act "gelu", absolute positions).
// Throws sr1::Error naming the file and field for anything else.
BertConfig load_bert_config(const std::string& dir);

enum class Pooling { Mean, Cls };
Pooling parse_pooling(const std::string& name);  // "mean" | "cls"; throws UsageError

// What a checkpoint is loaded for: the encoder alone (BertModel; a pooler or task head in
// the file is ignored), or with BertForSequenceClassification's head (bert.pooler.dense and
// classifier, both required).
enum class BertHead { None, SequenceClassification };

class BertEncoder {
 public:
  // Config and safetensors weights of a Hugging Face folder (BertModel's tensor names,
  // with or without the "bert." prefix a BertFor* checkpoint has).
  static std::unique_ptr<BertEncoder> load(const std::string& dir, Backend& backend,
                                           BertHead head = BertHead::None);
  ~BertEncoder();
  BertEncoder(const BertEncoder&) = delete;
  BertEncoder& operator=(const BertEncoder&) = delete;

  const BertConfig& config() const { return config_; }
  int dim() const { return config_.hidden_size; }

  // ids: B rows of T token ids (row-major), mask: the same shape, 1 for a real token and
  // 0 for padding (padding may sit anywhere; it is excluded from attention and pooling).
  // Token types are all 0 and positions run 0..T-1, as the tokenizer and BertModel make
  // them for single texts. Writes B * dim() floats to `out` (host): pooled, then L2
  // normalised when `normalize`. T must not exceed max_position_embeddings. Throws
  // sr1::Error for that, for an id outside the vocabulary where mask is 1, and for a row
  // with no real token. Buffers grow to the largest batch seen (the caller bounds B * T).
  void encode(const int32_t* ids, const int32_t* mask, int B, int T, Pooling pooling,
              bool normalize, float* out);

  // BertForSequenceClassification's logits (needs BertHead::SequenceClassification): ids,
  // token types (0 for `[CLS] query [SEP]`, 1 for `passage [SEP]`, as the tokenizer's pair
  // template makes them; each in 0..type_vocab_size-1 where mask is 1) and mask as in
  // encode(). Writes B * num_labels floats to `out` (host): the classifier applied to the
  // pooler's tanh(dense(last hidden state of [CLS])), no activation after it.
  void classify(const int32_t* ids, const int32_t* types, const int32_t* mask, int B, int T,
                float* out);
  bool has_classifier() const;

 private:
  BertEncoder(BertConfig config, Backend& backend);
  // The embeddings and every layer over the batch, into the activations' hidden rows;
  // returns the real tokens of each row. Checks what encode() says it throws.
  std::vector<int> forward(const int32_t* ids, const int32_t* types, const int32_t* mask, int B,
                           int T);
  BertConfig config_;
  Backend& be_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sr1
