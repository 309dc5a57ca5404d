// The per-layer operations of the model, in the style of llm.c: explicit forward and
// backward functions over flat buffers. The model code (model/qwen2.cpp) is written once
// against this interface; each device (CPU, CUDA) is one implementation of it, chosen at
// run time. Buffers returned by `alloc*` live on the backend's device.
//
// Precision: activations and the compute copy of the weights are in the backend's
// compute type, llm.c's "floatX" (fp32 on the CPU, bf16 on CUDA) and travel as XPtr.
// Master weights, gradients, AdamW state and per-row statistics (rstd, lse, log-probs)
// are always fp32 (float*). Reductions accumulate in fp32.
//
// Layouts are row-major. "Rows" are the B*T token positions of a batch. Weights are
// stored (out, in) like PyTorch nn.Linear. Backward functions accumulate (+=) into
// parameter gradients, so micro-batches can be summed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sr1 {

// Shape of one attention call. The fused qkv row is [q (NH*hd) | k (NKV*hd) | v (NKV*hd)].
struct AttentionShape {
  int B = 0, T = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // true: query i sees keys j <= i (the decoder); false: every key of its sequence (an
  // encoder's bidirectional attention, forward only).
  bool causal = true;
  int qkv_dim() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
};

// Device scratch the CUDA attention (backend/cuda/attention.cu) takes for a shape: each row's
// key span (two int32), and for the backward its fp32 dq [B*T, NH*hd] and delta [B*T, NH].
// Here, not in the CUDA sources, so that a build without CUDA plans them too.
inline size_t attention_forward_scratch(const AttentionShape& s) {
  return 2 * sizeof(int32_t) * static_cast<size_t>(s.B) * s.T;
}
inline size_t attention_backward_scratch(const AttentionShape& s) {
  const size_t N = static_cast<size_t>(s.B) * s.T;
  return attention_forward_scratch(s) +
         sizeof(float) * (N * s.num_heads * s.head_dim + N * s.num_heads);
}

// The cuBLASLt workspace each CUDA process holds (backend/cuda/matmul.h); Hopper's kernels
// want 32 MiB.
constexpr size_t kMatmulWorkspaceBytes = size_t(32) << 20;

// A device pointer to elements of the backend's compute type. The model only offsets
// these and hands them from one backend call to the next; null (p == nullptr) means
// "absent" where an argument is optional.
struct XPtr {
  void* p = nullptr;
  size_t elem = sizeof(float);  // bytes per element
  XPtr operator+(size_t n) const { return XPtr{static_cast<char*>(p) + n * elem, elem}; }
  bool null() const { return p == nullptr; }
};

// Marks what CUDA kernels call too (nvcc compiles this header for backend/cuda).
#ifdef __CUDACC__
#define SR1_HOST_DEVICE __host__ __device__
#else
#define SR1_HOST_DEVICE
#endif

// Shape of one paged-attention call of the inference engine. The cache of one layer holds
// the keys and values of `num_blocks` blocks of `block_size` positions each, laid out
// k[num_blocks, num_kv_heads, block_size, head_dim] (v the same): a block's positions of one
// head are contiguous. A position's slot is block * block_size + offset in block.
struct PagedShape {
  int rows = 0;  // new tokens (queries) in this step, over all sequences
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int block_size = 0;
  int max_blocks = 0;  // columns of the block table
  SR1_HOST_DEVICE int qkv_dim() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
  // Element offset of head g of the position at `off` in cache block `block`.
  SR1_HOST_DEVICE size_t cache_offset(int block, int g, int off) const {
    return ((static_cast<size_t>(block) * num_kv_heads + g) * block_size + off) * head_dim;
  }
};


// How one row of next-token logits is sampled (the inference engine; engine/sampler.h has
// the rule). temperature 0: greedy. uniform: the draw in [0, 1) from the sequence's own
// generator. top_k (> 0), top_p (< 1) and min_p (> 0) cut the vocabulary first.
struct SampleRow {
  float temperature = 0;
  double uniform = 0;
  float top_p = 1;
  int top_k = -1;
  float min_p = 0;
  // top-k, top-p or min-p cut the vocabulary of V
  SR1_HOST_DEVICE bool filtered(int V) const {
    return temperature != 0 && ((top_k > 0 && top_k < V) || top_p < 1 || min_p > 0);
  }
};

// A sampled token and its log-prob under log_softmax(logits / temperature) (temperature 1
// when greedy) over the whole vocabulary.
struct TokenDraw {
  int32_t token = 0;
  float logprob = 0;
};

struct AdamWParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient first (global-norm clipping)
};

// Times operations on a backend's queue of work (--profile): begin() and end() bracket one
// operation; read() waits for the queued work and returns each bracket's milliseconds in
// order, then forgets them. Each device has its own (the GPU's queue runs ahead of the host).
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual void begin() = 0;
  virtual void end() = 0;
  virtual std::vector<double> read() = 0;
};

// Device work recorded once and queued again with one call (a CUDA graph): the same
// kernels on the same pointers and shapes, whatever those buffers hold by then.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Waits for queued device work (for timing); a no-op on the CPU.
  virtual void synchronize() {}

  // ---- memory (counts are elements) ----
  // Bytes per compute-type element: 4 means XPtr buffers are plain floats, so the model
  // computes on its fp32 master weights directly instead of keeping a copy.
  virtual size_t x_elem() const = 0;
  virtual float* alloc(size_t n) = 0;
  virtual int32_t* alloc_i32(size_t n) = 0;
  virtual XPtr alloc_x(size_t n) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(float* dst, const float* src, size_t n) = 0;
  virtual void upload_i32(int32_t* dst, const int32_t* src, size_t n) = 0;
  virtual void download(float* dst, const float* src, size_t n) = 0;
  virtual void zero(float* p, size_t n) = 0;
  virtual void zero_x(XPtr p, size_t n) = 0;
  // dst = src rounded to the compute type (device to device)
  virtual void to_x(XPtr dst, const float* src, size_t n) = 0;
  // dst (host, fp32) = src (device, compute type)
  virtual void download_x(float* dst, XPtr src, size_t n) = 0;
  // Byte copies between host and device (a model's compute copy parked in host memory).
  virtual void upload_bytes(void* dst, const void* src, size_t bytes) = 0;
  virtual void download_bytes(void* dst, const void* src, size_t bytes) = 0;
  // Host memory for what the trainer keeps off the device (a learner's offloads,
  // train/learner.h; a model's compute copy between phases, Qwen2Model::to_host): page-locked
  // and mapped on CUDA (cudaHostAlloc), so that copies run at full speed and the element-wise
  // optimizer operations below (to_x, sum_squares, accumulate, adamw_update) may read and
  // write it through the same pointer over the bus (zero-copy); plain memory on the CPU,
  // where host and device are one. Neither peak_bytes() nor live_bytes() counts it.
  virtual void* alloc_host(size_t bytes);
  virtual void release_host(void* p);
  // Largest number of bytes the backend's buffers held at once since the last reset.
  virtual size_t peak_bytes() const { return peak_; }
  virtual size_t live_bytes() const { return live_; }
  // Bytes the device could still allocate (host RAM not in use, or free GPU memory).
  virtual size_t free_bytes() const = 0;
  // The device's memory in all (RAM on the CPU), for budgets given as a fraction of it.
  virtual size_t total_bytes() const = 0;
  virtual void reset_peak_bytes() { peak_ = live_; }
  // A timer of this backend's operations (the host's clock where they run synchronously).
  virtual std::unique_ptr<DeviceTimer> timer() const;
  // Graphs: the operations called between begin_capture() and end_capture() are recorded,
  // not run; they may not copy to or from the host or wait for the device. Only where
  // can_capture() (CUDA; not under --profile, whose timer waits).
  virtual bool can_capture() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<DeviceGraph> end_capture();

  // ---- layers ----
  // out[N,C] = wte[ids[n]]
  virtual void embedding_forward(XPtr out, const int32_t* ids, XPtr wte, int N, int C) = 0;
  // dwte[ids[n]] += dout[n]
  virtual void embedding_backward(float* dwte, XPtr dout, const int32_t* ids, int N,
                                  int C) = 0;
  // out = w * inp * rstd, rstd = 1/sqrt(mean(inp^2) + eps), per row
  virtual void rmsnorm_forward(XPtr out, float* rstd, XPtr inp, XPtr w, int N, int C,
                               float eps) = 0;
  // dinp += d(out)/d(inp) . dout ; dw += sum over rows (dw null: skipped, a frozen norm's)
  virtual void rmsnorm_backward(XPtr dinp, float* dw, XPtr dout, XPtr inp, XPtr w,
                                const float* rstd, int N, int C) = 0;
  // out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias[OC]; bias may be null)
  virtual void matmul_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C, int OC) = 0;
  // dinp[N,C] = (or +=, with accumulate) dout . w ; dw += dout^T . inp ; dbias += colsum
  // Any of dinp, dw, dbias may be null to skip it.
  virtual void matmul_backward(XPtr dinp, float* dw, float* dbias, XPtr dout, XPtr inp, XPtr w,
                               int N, int C, int OC, bool accumulate_dinp) = 0;
  // Rotary embedding (rotate_half pairing j, j+hd/2) of the q and k parts of each fused
  // qkv row, in place, at the row's position. Backward applies the inverse rotation to the
  // gradient.
  virtual void rope_forward(XPtr qkv, const int32_t* pos, const AttentionShape& s,
                            float theta) = 0;
  virtual void rope_backward(XPtr dqkv, const int32_t* pos, const AttentionShape& s,
                             float theta) = 0;
  // Throws sr1::Error, naming the value, when this backend's attention kernels
  // (attention_forward, attention_backward, paged_attention) are not built for head_dim:
  // the trainer and the inference engine accept the same head dims on one device. The CPU
  // runs any head_dim; CUDA runs 16, 32, 64 and 128. Each attention call checks it; a
  // caller may check it first, before it allocates or announces anything.
  virtual void require_head_dim(int head_dim) const { (void)head_dim; }
  // Grouped-query attention, causal or, when !s.causal, bidirectional. key_mask[b*T+j] is 0
  // for padding, which no query sees, and otherwise the id of the sequence token j belongs
  // to. A row may hold several sequences end to end (packing, verl's remove-padding): the
  // row is cut into spans, a new span starting at each token whose id differs from the last
  // nonzero id before it (padding between sequences stays in the span before it). Query i
  // sees the unmasked keys j of its own span with j <= i, or all of them. A 0/1 mask is one
  // span per row. out[N, NH*hd]; lse[B, NH, T] keeps each row's log-sum-exp for the backward
  // pass (-inf for a query row that can see no key; its output is zeros). lse may be null
  // when no backward pass follows (the encoder).
  virtual void attention_forward(XPtr out, float* lse, XPtr qkv, const int32_t* key_mask,
                                 const AttentionShape& s) = 0;
  // dqkv[N, qkv_dim] = gradient of q, k, v (overwritten). Causal attention only: throws
  // sr1::Error for a bidirectional shape.
  virtual void attention_backward(XPtr dqkv, XPtr dout, XPtr qkv, XPtr out, const float* lse,
                                  const int32_t* key_mask, const AttentionShape& s) = 0;
  // gu row = [gate (I) | up (I)]; out[N,I] = silu(gate) * up
  virtual void swiglu_forward(XPtr out, XPtr gu, int N, int I) = 0;
  // matmul_forward into gu (w [2I, C], no bias), then swiglu_forward into act: the same values.
  // CUDA may run both in one kernel for a few rows and leave gu unwritten
  // (SEARCHR1_FUSED_DECODE=on), so gu is scratch here (the engine's layers; the trainer keeps
  // gu for its backward and calls the two).
  virtual void matmul_swiglu_forward(XPtr act, XPtr gu, XPtr inp, XPtr w, int N, int C, int I);
  virtual void swiglu_backward(XPtr dgu, XPtr dout, XPtr gu, int N, int I) = 0;
  // out = a + b (out may alias a)
  virtual void add(XPtr out, XPtr a, XPtr b, size_t n) = 0;
  // sum = a + b (sum may alias a), then out = rmsnorm_forward of sum: a residual add and the
  // norm after it (the engine's layers). The same values as the two calls; CUDA may do both in
  // one kernel (SEARCHR1_FUSED_DECODE=on: a decode step's small kernels cost more than their
  // arithmetic).
  virtual void add_rmsnorm_forward(XPtr sum, XPtr out, float* rstd, XPtr a, XPtr b, XPtr w,
                                   int N, int C, float eps);
  // x *= s, in place (the language-model head's 1/temperature)
  virtual void scale(XPtr x, float s, size_t n) = 0;
  // dst[r * ld_dst + c] = src[r * ld_src + c] (or +=, with accumulate) for r < rows, c < cols:
  // a block of columns of one row-major matrix to or from another (a LoRA adapter's slice of
  // a fused projection: model/lora.h). dst and src do not overlap.
  virtual void copy_columns(XPtr dst, int ld_dst, XPtr src, int ld_src, int rows, int cols,
                            bool accumulate) = 0;

  // ---- encoder (BERT) layers, forward only ----
  // out = (inp - mean) / sqrt(var + eps) * w + bias per row of C, with the biased variance
  // (PyTorch's LayerNorm); statistics in fp32 or better. out may alias inp.
  virtual void layernorm_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C,
                                 float eps) = 0;
  // out = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))): the exact GELU (PyTorch's default, BERT's
  // "gelu"), not the tanh approximation. out may alias inp.
  virtual void gelu_forward(XPtr out, XPtr inp, size_t n) = 0;

  // ---- paged KV cache (the inference engine) ----
  // Rotates the q and k heads of each fused qkv row at pos[r] (rope_forward), then copies its
  // k and v heads to the cache at slots[r].
  virtual void rope_kv_store(XPtr qkv, const int32_t* pos, XPtr k_cache, XPtr v_cache,
                             const int32_t* slots, const PagedShape& s, float theta) = 0;
  // out[r, NH*hd] = causal GQA attention of row r's q heads over the cached keys and values
  // of positions 0..pos[r] of sequence seq[r], whose blocks are
  // block_tables[seq[r] * max_blocks + position / block_size].
  virtual void paged_attention(XPtr out, XPtr qkv, XPtr k_cache, XPtr v_cache,
                               const int32_t* block_tables, const int32_t* seq,
                               const int32_t* pos, const PagedShape& s) = 0;

  // ---- language-model head, on the rows that predict a token ----
  // out[r] = in[rows[r]] for r < n
  virtual void gather_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) = 0;
  // out[rows[r]] = in[r] (rows distinct)
  virtual void scatter_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) = 0;
  // For each of n rows of logits[n,V]: logprob of targets[r] and entropy of the softmax.
  virtual void logprob_forward(float* logprob, float* entropy, XPtr logits,
                               const int32_t* targets, int n, int V) = 0;
  // In place: logits[r] <- the gradient of -coef[r] * logprob[r] + ent_coef[r] * entropy[r]
  // with respect to the row: coef[r] * (p - onehot(targets[r])) - ent_coef[r] * p * (log p + H),
  // p = softmax(logits[r]), H its entropy. ent_coef may be null (no entropy term).
  virtual void logprob_backward(XPtr logits, const int32_t* targets, const float* coef,
                                const float* ent_coef, int n, int V) = 0;

  // ---- sampling (the inference engine) ----
  // out[r] (host) for each row r of logits[n, V] by rows[r] (host), the rule of
  // backend/sample_row.h: greedy, the lowest id among the largest logits; else the first
  // token, in id order, at which the running sum of softmax(logits[r] / temperature) exceeds
  // rows[r].uniform (the last token of nonzero probability if rounding leaves the sum below
  // it); a filtered row draws among the tokens the cut keeps, in probability order. Sums in
  // fp64. A backend may leave a filtered row undone (token -1; CUDA, where the cut falls past
  // the candidates it sorts): the caller samples it from its logits with sample_row.
  virtual void sample_tokens(TokenDraw* out, XPtr logits, const SampleRow* rows, int n,
                             int V) = 0;

  // ---- optimiser (fp32 master weights and state) ----
  virtual double sum_squares(const float* x, size_t n) = 0;
  // dst += src, fp32 (a gradient shard accumulating the ranks' reduced micro-batches)
  virtual void accumulate(float* dst, const float* src, size_t n) = 0;
  // p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), PyTorch AdamW order
  virtual void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                            const AdamWParams& a) = 0;

 protected:
  // Implementations report each allocation and release, for peak_bytes().
  void track_alloc(void* p, size_t bytes);
  void track_release(void* p);

 private:
  std::map<void*, size_t> sizes_;
  size_t live_ = 0, peak_ = 0;
};

// What the CUDA backend would run on, or why it cannot: for `--device auto` and the
// `info` command.
struct CudaStatus {
  bool built = false;      // compiled with nvcc
  bool available = false;  // a GPU is visible and cuBLASLt loaded
  std::string reason;      // why not, when unavailable
  std::string gpu;         // device name and compute capability
  std::string cublaslt;    // the library file that was loaded
};
CudaStatus cuda_status();

// "cpu" (the reference; always available), "cuda", or "auto" (cuda when cuda_status()
// says it is available, else cpu with a note on stderr saying why). Throws
// sr1::UsageError for an unknown device, or for "cuda" when it is unavailable.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace sr1
