#include "kernels/model_forward.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "kernels/cublas_check.h"
#include "kernels/cuda_check.h"
#include "kernels/device.h"
#include "kernels/device_buffer.h"
#include "kernels/model_forward_kernels.h"
#include "kernels/unit_reconstruction.h"
#include "sim/core/error.h"
#include "sim/core/rope.h"
#include "sim/model/rope_scaling.h"

namespace kvb::cuda {

namespace {

// A weight matrix [rows, cols] on the device in its stored dtype.
struct DeviceMatrix {
  WeightDtype dtype = WeightDtype::F32;
  int64_t rows = 0, cols = 0;
  DeviceBuffer<uint16_t> bits;  // F16 / BF16
  DeviceBuffer<float> f32;      // F32

  void upload(const WeightMatrix& w) {
    rows = w.rows();
    cols = w.cols();
    if (const RowMatrix* m = w.f32()) {
      dtype = WeightDtype::F32;
      f32.resize(static_cast<size_t>(m->size()));
      f32.upload(m->data(), static_cast<size_t>(m->size()));
    } else {
      dtype = w.dtype() == DType::F16 ? WeightDtype::F16 : WeightDtype::BF16;
      bits.resize(w.bits16().size());
      bits.upload(w.bits16().data(), w.bits16().size());
    }
  }
  const void* data() const { return dtype == WeightDtype::F32 ? static_cast<const void*>(f32.data()) : bits.data(); }
  size_t bytes() const { return f32.bytes() + bits.bytes(); }
};

struct DeviceVector {
  DeviceBuffer<float> v;
  void upload(const Eigen::VectorXf& x) {
    v.resize(static_cast<size_t>(x.size()));
    if (x.size()) v.upload(x.data(), static_cast<size_t>(x.size()));
  }
  const float* data() const { return v.size() ? v.data() : nullptr; }
};

struct DeviceDense {
  DeviceMatrix weight;  // [out, in]
  DeviceVector bias;    // [out] or empty
  void upload(const DenseWeights& w) {
    weight.upload(w.weight);
    bias.upload(w.bias);
  }
};

struct DeviceNorm {
  DeviceVector weight, bias;  // bias empty: RMSNorm
  void upload(const NormWeights& n) {
    weight.upload(n.weight);
    bias.upload(n.bias);
  }
};

struct DeviceBlock {
  DeviceNorm attn_norm, mlp_norm;
  DeviceDense qkv, attn_out, mlp_in, mlp_out;
};

int activation_code(Activation a) {
  switch (a) {
    case Activation::GeluTanh: return 0;
    case Activation::GeluErf: return 1;
    case Activation::Relu: return 2;
    case Activation::Silu: return 3;
  }
  return 3;
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) throw Error(std::string("CUDA forward pass: ") + what + " " + std::to_string(v) +
                                          " exceeds the device kernels' 32-bit range");
  return static_cast<int>(v);
}

// [heads, n, d] tensor of the per-head column blocks of a host [n, stride] matrix.
Tensor heads_tensor(const std::vector<float>& src, int64_t stride, int64_t first_col, int64_t heads, int64_t n,
                    int64_t d) {
  Tensor t({heads, n, d});
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < n; ++r)
      std::copy(src.begin() + r * stride + first_col + h * d, src.begin() + r * stride + first_col + (h + 1) * d,
                t.slice(h) + r * d);
  return t;
}

// One layer's attention over its device cache, with or without a plan: the part of the
// forward pass that attention_on_device() exposes to the tests.
struct LayerAttention {
  TwinCache twins;
  // The layer's reconstructed versions [kv_heads, context, head_dim].
  DeviceBuffer<float> k_stored, k_window, v_stored, v_window;
  DeviceBuffer<int32_t> residual_from, residual_window;  // [2 (K, V), kv_heads, n]
  std::vector<int32_t> host_from, host_window;

  // queries: row r, head h at queries + r * query_stride + h * d (device), for positions
  // context - n .. context - 1; keys and values of KV head g at keys + g * exact_unit,
  // [context, d] rows (device). out [n, q_heads * d] (device).
  void run(const float* queries, int64_t query_stride, int64_t n, int64_t context, const float* keys,
           const float* values, int64_t exact_unit, const AttentionGeometry& geo, int64_t layer,
           const CacheQuantization& cache, float* out, cudaStream_t stream) {
    const int64_t d = geo.head_dim, first = context - n, version_unit = context * d;
    AttentionArgs a;
    a.queries = queries;
    a.query_stride = query_stride;
    a.n = to_int(n, "tokens");
    a.first = first;
    a.q_heads = to_int(geo.q_heads, "q_heads");
    a.kv_heads = to_int(geo.kv_heads, "kv_heads");
    a.d = to_int(d, "head_dim");
    a.window = to_int(geo.window, "sliding window");
    a.score_scale = geo.score_scale;
    a.k_exact = a.k_stored = keys;
    a.v_exact = a.v_stored = values;
    a.exact_unit_stride = a.version_unit_stride = exact_unit;
    a.out = out;
    if (cache.plan) {  // every unit's versions at the cache's length, as KvCache::view
      const Plan& plan = *cache.plan;
      const int64_t prefill = cache.effective_prefill();
      const size_t versions = static_cast<size_t>(geo.kv_heads * version_unit);
      k_stored.reserve(versions);
      v_stored.reserve(versions);
      k_window.reserve(versions);
      v_window.reserve(versions);
      host_from.assign(static_cast<size_t>(2 * geo.kv_heads * n), 0);
      host_window.assign(host_from.size(), 0);
      for (int64_t g = 0; g < geo.kv_heads; ++g)
        for (Kind kind : {Kind::Key, Kind::Value}) {
          const bool is_key = kind == Kind::Key;
          try {
            const UnitPlan unit = plan.phase_marker() ? plan.unit_at(layer, g, kind, context, cache.second_phase)
                                                      : plan.unit_at(layer, g, kind, context);
            reconstruct_unit_on_device(twins, unit, (is_key ? keys : values) + g * exact_unit, context, d,
                                       (is_key ? k_stored : v_stored).data() + g * version_unit,
                                       (is_key ? k_window : v_window).data() + g * version_unit, stream);
            for (int64_t r = 0; r < n; ++r) {
              const RowVersions rv = row_versions(unit, prefill, first + r);
              const size_t at = static_cast<size_t>(((is_key ? 0 : 1) * geo.kv_heads + g) * n + r);
              host_from[at] = rv.all_exact ? 0 : static_cast<int32_t>(std::min(rv.residual_begin, context));
              host_window[at] = !rv.all_exact && rv.residual_window ? 1 : 0;
            }
          } catch (const std::exception& e) {
            throw Error(unit_name(layer, g, kind) + ": " + e.what());
          }
        }
      residual_from.reserve(host_from.size());
      residual_window.reserve(host_window.size());
      residual_from.upload(host_from.data(), host_from.size());
      residual_window.upload(host_window.data(), host_window.size());
      a.k_stored = k_stored.data();
      a.k_window = k_window.data();
      a.v_stored = v_stored.data();
      a.v_window = v_window.data();
      a.version_unit_stride = version_unit;
      a.residual_from = residual_from.data();
      a.residual_window = residual_window.data();
    }
    launch_causal_attention(a, stream);
  }
};

}  // namespace

std::vector<float> attention_on_device(const float* queries, int64_t n, const float* keys, const float* values,
                                       int64_t context, const AttentionGeometry& geo, int64_t layer,
                                       const CacheQuantization& cache) {
  const DeviceInfo dev = device_info();
  if (!dev.available) throw Error("CUDA forward pass: no usable CUDA device (" + dev.why_not + ")");
  if (cache.plan) {
    if (const std::string why = forward_unsupported_reason(*cache.plan); !why.empty())
      throw Error("CUDA forward pass: " + why);
  }
  const int64_t d = geo.head_dim, width = geo.q_heads * d;
  DeviceBuffer<float> q(static_cast<size_t>(n * width)), k(static_cast<size_t>(geo.kv_heads * context * d)),
      v(k.size()), out(q.size());
  q.upload(queries, q.size());
  k.upload(keys, k.size());
  v.upload(values, v.size());
  LayerAttention attention;
  attention.run(q.data(), width, n, context, k.data(), v.data(), context * d, geo, layer, cache, out.data(), nullptr);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

const char* forward_math_name(ForwardMath m) { return m == ForwardMath::Tf32 ? "tf32" : "fp32"; }

std::string forward_unsupported_reason(const Plan& plan) { return missing_twin(plan); }

struct CudaTransformer::DeviceCache {
  int64_t capacity = 0;  // tokens each unit can hold
  std::vector<DeviceBuffer<float>> keys, values;  // per layer [kv_heads, capacity, head_dim]
};

struct CudaTransformer::Impl {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceMatrix token_embedding, position_embedding, lm_head;
  std::vector<DeviceBlock> blocks;
  DeviceNorm final_norm;
  std::vector<float> inv_freq;  // RoPE inverse frequencies [head_dim / 2] (the host model's)
  // Scratch, grown as needed: a 16-bit weight in fp32; activations [n, *].
  DeviceBuffer<float> weight32, x, h, qkv, attn, proj, mlp, act, rope_cos, rope_sin;
  DeviceBuffer<int32_t> tokens;
  LayerAttention attention;
  State forward_state;  // forward()'s, reused between passes
  // The logits' way to the host (logits_to_host): two slots, each a chunk of rows on the
  // device and in page-locked memory, and the events that order their reuse.
  cudaStream_t copy_stream = nullptr;
  DeviceBuffer<float> logits_chunk[2];
  PinnedBuffer<float> logits_staging[2];
  cudaEvent_t chunk_computed[2] = {}, chunk_copied[2] = {};

  ~Impl() {
    for (cudaEvent_t e : {chunk_computed[0], chunk_computed[1], chunk_copied[0], chunk_copied[1]})
      if (e) cudaEventDestroy(e);
    if (blas) cublasDestroy(blas);
    if (copy_stream) cudaStreamDestroy(copy_stream);
    if (stream) cudaStreamDestroy(stream);
  }

  const DeviceMatrix& output_embedding() const { return lm_head.rows ? lm_head : token_embedding; }

  // The weight as fp32 on the device: its own memory, or weight32 holding it converted
  // exactly (valid until the next conversion).
  const float* fp32_weight(const DeviceMatrix& w) {
    if (w.dtype == WeightDtype::F32) return w.f32.data();
    weight32.reserve(static_cast<size_t>(w.rows * w.cols));
    launch_weight_to_f32(w.data(), w.dtype, 0, w.rows * w.cols, weight32.data(), stream);
    return weight32.data();
  }
  // y [rows, w.rows] = x [rows, w.cols] · w32ᵀ (+ bias), fp32; w32 = fp32_weight(w).
  void gemm(const float* in, int64_t rows, const DeviceMatrix& w, const float* w32, const DeviceVector* bias,
            float* y) {
    if (rows == 0) return;
    const bool has_bias = bias && bias->data();
    if (has_bias) launch_broadcast_rows(bias->data(), to_int(rows, "rows"), to_int(w.rows, "columns"), y, stream);
    const float one = 1.0f, beta = has_bias ? 1.0f : 0.0f;
    const int m = to_int(w.rows, "output features"), n = to_int(rows, "rows"), k = to_int(w.cols, "input features");
    KVB_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w32, k, in, k, &beta, y, m));
  }
  // Whether a product of `rows` rows with 16-bit weight w reads w in place
  // (launch_skinny_dense: a decoding step's few rows) instead of converting it to fp32
  // for a GEMM, which would move three times its bytes.
  static bool skinny(int64_t rows, const DeviceMatrix& w) {
    return rows <= kMaxSkinnyRows && w.dtype != WeightDtype::F32;
  }
  void skinny_dense(const float* in, int64_t rows, const DeviceMatrix& w, const DeviceVector* bias, float* y) {
    launch_skinny_dense(in, static_cast<int>(rows), w.data(), w.dtype, w.rows, w.cols,
                        bias && bias->data() ? bias->data() : nullptr, y, stream);
  }
  // y [rows, out] = x [rows, in] · weightᵀ (+ bias), fp32 (weight converted exactly).
  void dense(const float* in, int64_t rows, const DeviceMatrix& w, const DeviceVector* bias, float* y) {
    if (rows == 0) return;
    if (skinny(rows, w)) return skinny_dense(in, rows, w, bias, y);
    gemm(in, rows, w, fp32_weight(w), bias, y);
  }
  void dense(const float* in, int64_t rows, const DeviceDense& d, float* y) { dense(in, rows, d.weight, &d.bias, y); }

  // Logits [rows, vocab] of the final-normed hidden states `normed` [rows, hidden]
  // (device) into `out` (host, row-major; any memory). The output embedding's product
  // runs in chunks of rows on `stream` (at most logits_chunk_bytes each; a multiple of
  // 128 rows when that is 128 or more); each chunk is copied to page-locked memory on
  // copy_stream while the next one computes, then into `out` by the host's threads
  // while the device goes on. The same numbers as one
  // product (each logit is one dot product; cuBLAS may pick another kernel for the
  // chunk's row count, so the last bit can differ from a single product of all rows).
  int64_t logits_chunk_bytes = int64_t{128} << 20;
  void logits_to_host(const float* normed, int64_t rows, float* out) {
    const DeviceMatrix& embedding = output_embedding();
    const int64_t vocab = embedding.rows, hidden = embedding.cols;
    int64_t chunk = std::max<int64_t>(logits_chunk_bytes / (vocab * 4), 1);
    if (chunk >= 128) chunk -= chunk % 128;  // whole tiles of the product's row dimension
    chunk = std::min(chunk, rows);
    const int64_t chunks = (rows + chunk - 1) / chunk;
    for (int s = 0; s < 2; ++s) {
      logits_chunk[s].reserve(static_cast<size_t>(chunk * vocab));
      logits_staging[s].reserve(static_cast<size_t>(chunk * vocab));
    }
    const bool in_place = skinny(rows, embedding);
    const float* w32 = in_place ? nullptr : fp32_weight(embedding);
    auto rows_of = [&](int64_t c) { return std::min(chunk, rows - c * chunk); };
    auto drain = [&](int64_t c) {  // chunk c: staging -> out, once its copy is done
      const int s = static_cast<int>(c % 2);
      KVB_CUDA_CHECK(cudaEventSynchronize(chunk_copied[s]));
      copy_in_parallel(logits_staging[s].data(), rows_of(c) * vocab, out + c * chunk * vocab);
    };
    for (int64_t c = 0; c < chunks; ++c) {
      const int s = static_cast<int>(c % 2);
      if (c >= 2) drain(c - 2);  // slot s is free again on the device and the host
      if (in_place) skinny_dense(normed + c * chunk * hidden, rows_of(c), embedding, nullptr, logits_chunk[s].data());
      else gemm(normed + c * chunk * hidden, rows_of(c), embedding, w32, nullptr, logits_chunk[s].data());
      KVB_CUDA_CHECK(cudaEventRecord(chunk_computed[s], stream));
      KVB_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, chunk_computed[s], 0));
      KVB_CUDA_CHECK(cudaMemcpyAsync(logits_staging[s].data(), logits_chunk[s].data(),
                                     static_cast<size_t>(rows_of(c) * vocab) * sizeof(float), cudaMemcpyDeviceToHost,
                                     copy_stream));
      KVB_CUDA_CHECK(cudaEventRecord(chunk_copied[s], copy_stream));
    }
    for (int64_t c = std::max<int64_t>(0, chunks - 2); c < chunks; ++c) drain(c);
  }
  // dst[0, count) = src[0, count), pieces of 1 MiB on the host's threads.
  static void copy_in_parallel(const float* src, int64_t count, float* dst) {
    constexpr int64_t kPiece = int64_t{1} << 18;
    const int64_t pieces = (count + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t i = 0; i < pieces; ++i)
      std::memcpy(dst + i * kPiece, src + i * kPiece, static_cast<size_t>(std::min(kPiece, count - i * kPiece)) * 4);
  }

  // Room for `tokens` tokens per unit, keeping the first `length`.
  void reserve_cache(DeviceCache& cache, int64_t tokens, int64_t length, int64_t kv_heads, int64_t d) {
    if (tokens <= cache.capacity) return;
    const int64_t capacity = std::max(tokens, 2 * cache.capacity);
    for (std::vector<DeviceBuffer<float>>* kind : {&cache.keys, &cache.values})
      for (DeviceBuffer<float>& layer : *kind) {
        DeviceBuffer<float> grown(static_cast<size_t>(kv_heads * capacity * d));
        if (length > 0)
          KVB_CUDA_CHECK(cudaMemcpy2DAsync(grown.data(), capacity * d * sizeof(float), layer.data(),
                                           cache.capacity * d * sizeof(float), length * d * sizeof(float), kv_heads,
                                           cudaMemcpyDeviceToDevice, stream));
        KVB_CUDA_CHECK(cudaStreamSynchronize(stream));
        layer = std::move(grown);
      }
    cache.capacity = capacity;
  }
};

CudaTransformer::CudaTransformer(std::shared_ptr<const Transformer> host, ForwardMath math)
    : host_(std::move(host)), math_(math), impl_(std::make_unique<Impl>()) {
  const DeviceInfo dev = device_info();
  if (!dev.available) throw Error("CUDA forward pass: no usable CUDA device (" + dev.why_not + ")");
  const ModelConfig& c = host_->config();
  if (c.head_dim > kMaxAttentionHeadDim)
    throw Error("CUDA forward pass: head_dim " + std::to_string(c.head_dim) + " of " + c.dir.string() +
                " exceeds the attention kernel's maximum of " + std::to_string(kMaxAttentionHeadDim));
  Impl& m = *impl_;
  KVB_CUDA_CHECK(cudaSetDevice(0));
  KVB_CUDA_CHECK(cudaStreamCreate(&m.stream));
  KVB_CUDA_CHECK(cudaStreamCreate(&m.copy_stream));
  for (int s = 0; s < 2; ++s) {
    KVB_CUDA_CHECK(cudaEventCreateWithFlags(&m.chunk_computed[s], cudaEventDisableTiming));
    KVB_CUDA_CHECK(cudaEventCreateWithFlags(&m.chunk_copied[s], cudaEventDisableTiming));
  }
  KVB_CUBLAS_CHECK(cublasCreate(&m.blas));
  KVB_CUBLAS_CHECK(cublasSetStream(m.blas, m.stream));
  KVB_CUBLAS_CHECK(
      cublasSetMathMode(m.blas, math == ForwardMath::Tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const ModelWeights& w = host_->weights();
  m.token_embedding.upload(w.token_embedding);
  if (!w.position_embedding.empty()) m.position_embedding.upload(w.position_embedding);
  if (!w.lm_head.empty()) m.lm_head.upload(w.lm_head);
  if (m.position_embedding.rows && m.position_embedding.dtype != m.token_embedding.dtype)
    throw Error("CUDA forward pass: " + c.dir.string() +
                ": the token and position embeddings are held in different dtypes");
  m.blocks.resize(w.blocks.size());
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    const BlockWeights& b = w.blocks[l];
    DeviceBlock& d = m.blocks[l];
    d.attn_norm.upload(b.attn_norm);
    d.mlp_norm.upload(b.mlp_norm);
    d.qkv.upload(b.qkv);
    d.attn_out.upload(b.attn_out);
    d.mlp_in.upload(b.mlp_in);
    d.mlp_out.upload(b.mlp_out);
  }
  m.final_norm.upload(w.final_norm);
  if (c.rope.enabled) m.inv_freq = rope_inverse_frequencies(c.rope, c.head_dim);
  m.forward_state = new_state();
}

CudaTransformer::~CudaTransformer() = default;

void CudaTransformer::set_logits_chunk_bytes(int64_t bytes) { impl_->logits_chunk_bytes = std::max<int64_t>(bytes, 1); }

size_t CudaTransformer::weight_bytes() const {
  const Impl& m = *impl_;
  size_t b = m.token_embedding.bytes() + m.position_embedding.bytes() + m.lm_head.bytes();
  for (const DeviceBlock& d : m.blocks)
    b += d.qkv.weight.bytes() + d.attn_out.weight.bytes() + d.mlp_in.weight.bytes() + d.mlp_out.weight.bytes();
  return b;
}

CudaTransformer::State CudaTransformer::new_state() const {
  State s;
  s.cache = std::make_shared<DeviceCache>();
  s.cache->keys.resize(static_cast<size_t>(config().layers));
  s.cache->values.resize(static_cast<size_t>(config().layers));
  return s;
}

RowMatrix CudaTransformer::extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt) const {
  RowMatrix logits(opt.all_logits ? static_cast<int64_t>(tokens.size()) : 1, config().vocab_size);
  extend(state, tokens, opt, logits.data());
  return logits;
}

void CudaTransformer::extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt,
                             float* logits) const {
  Impl& m = *impl_;
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t first = state.length, context = first + n;
  const int64_t d = c.head_dim, qkv_width = c.qkv_width(), H = c.hidden_size, I = c.intermediate_size;
  const int64_t k_col = c.q_heads * d, v_col = k_col + c.kv_heads * d;
  if (n == 0) throw Error("internal: extend() with no tokens");
  host_->check_tokens(tokens, first);
  to_int(context, "context of");
  if (opt.cache.plan) {
    check_plan_fits(*opt.cache.plan, c.layers, c.kv_heads, d);
    if (const std::string why = forward_unsupported_reason(*opt.cache.plan); !why.empty())
      throw Error("CUDA forward pass: " + why);
  }
  state.tokens.insert(state.tokens.end(), tokens.begin(), tokens.end());
  const CacheQuantization cache = opt.cache.for_tokens(state.tokens);
  if (opt.capture) opt.capture->assign(static_cast<size_t>(c.layers), LayerTensors{});
  DeviceCache& kv = *state.cache;
  m.reserve_cache(kv, context, first, c.kv_heads, d);

  const size_t nn = static_cast<size_t>(n);
  m.x.reserve(nn * H);
  m.h.reserve(nn * H);
  m.qkv.reserve(nn * qkv_width);
  m.attn.reserve(nn * c.q_heads * d);
  m.proj.reserve(nn * H);
  m.mlp.reserve(nn * (c.gated_mlp ? 2 * I : I));
  if (c.gated_mlp) m.act.reserve(nn * I);
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  m.tokens.reserve(nn);
  m.tokens.upload(ids.data(), nn);
  launch_embed(m.tokens.data(), to_int(n, "tokens"), m.token_embedding.data(),
               m.position_embedding.rows ? m.position_embedding.data() : nullptr, m.token_embedding.dtype, first,
               to_int(H, "hidden_size"), m.x.data(), m.stream);
  if (c.rope.enabled) {  // cos/sin of the new tokens' positions, as the host computes them
    std::vector<int64_t> positions(nn);
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = first + i;
    const RopeTable rope = make_rope_table(n, positions.data(), m.inv_freq);
    m.rope_cos.reserve(rope.cos.size());
    m.rope_sin.reserve(rope.sin.size());
    m.rope_cos.upload(rope.cos.data(), rope.cos.size());
    m.rope_sin.upload(rope.sin.data(), rope.sin.size());
  }
  const int64_t exact_unit = kv.capacity * d;

  for (int64_t l = 0; l < c.layers; ++l) {
    const DeviceBlock& blk = m.blocks[static_cast<size_t>(l)];
    LayerTensors* cap = opt.capture ? &(*opt.capture)[static_cast<size_t>(l)] : nullptr;
    float* keys = kv.keys[static_cast<size_t>(l)].data();
    float* values = kv.values[static_cast<size_t>(l)].data();

    launch_normalize_rows(m.x.data(), blk.attn_norm.weight.data(), blk.attn_norm.bias.data(), c.norm_eps,
                          static_cast<int>(n), static_cast<int>(H), m.h.data(), m.stream);
    m.dense(m.h.data(), n, blk.qkv, m.qkv.data());
    if (cap && c.rope.enabled)
      cap->key_pre_rope = heads_tensor(m.qkv.download(nn * qkv_width), qkv_width, k_col, c.kv_heads, n, d);
    if (c.rope.enabled)
      launch_rope(m.qkv.data(), qkv_width, static_cast<int>(n), static_cast<int>(c.q_heads + c.kv_heads),
                  static_cast<int>(d), m.rope_cos.data(), m.rope_sin.data(), m.stream);
    if (cap) {
      const std::vector<float> host_qkv = m.qkv.download(nn * qkv_width);
      cap->query = heads_tensor(host_qkv, qkv_width, 0, c.q_heads, n, d);
      cap->key = heads_tensor(host_qkv, qkv_width, k_col, c.kv_heads, n, d);
      cap->value = heads_tensor(host_qkv, qkv_width, v_col, c.kv_heads, n, d);
    }
    launch_append_units(m.qkv.data(), qkv_width, k_col, static_cast<int>(n), static_cast<int>(c.kv_heads),
                        static_cast<int>(d), keys, exact_unit, first, m.stream);
    launch_append_units(m.qkv.data(), qkv_width, v_col, static_cast<int>(n), static_cast<int>(c.kv_heads),
                        static_cast<int>(d), values, exact_unit, first, m.stream);

    const AttentionGeometry geo{c.q_heads, c.kv_heads, d, c.score_scale(l), c.sliding_window[static_cast<size_t>(l)]};
    m.attention.run(m.qkv.data(), qkv_width, n, context, keys, values, exact_unit, geo, l, cache, m.attn.data(),
                    m.stream);
    if (cap) {
      cap->attn_output = Tensor({n, c.q_heads * d});
      const std::vector<float> host_attn = m.attn.download(nn * c.q_heads * d);
      std::copy(host_attn.begin(), host_attn.end(), cap->attn_output.ptr());
    }
    m.dense(m.attn.data(), n, blk.attn_out, m.proj.data());
    launch_add(m.x.data(), m.proj.data(), n * H, m.stream);

    launch_normalize_rows(m.x.data(), blk.mlp_norm.weight.data(), blk.mlp_norm.bias.data(), c.norm_eps,
                          static_cast<int>(n), static_cast<int>(H), m.h.data(), m.stream);
    m.dense(m.h.data(), n, blk.mlp_in, m.mlp.data());
    if (c.gated_mlp) {
      launch_gated_activation(m.mlp.data(), static_cast<int>(n), to_int(I, "intermediate_size"),
                              activation_code(c.activation), m.act.data(), m.stream);
      m.dense(m.act.data(), n, blk.mlp_out, m.proj.data());
    } else {
      launch_activate(m.mlp.data(), n * I, activation_code(c.activation), m.stream);
      m.dense(m.mlp.data(), n, blk.mlp_out, m.proj.data());
    }
    launch_add(m.x.data(), m.proj.data(), n * H, m.stream);
  }
  state.length = context;

  // Logits of every new token, or of the last one.
  const int64_t rows = opt.all_logits ? n : 1;
  launch_normalize_rows(m.x.data() + (n - rows) * H, m.final_norm.weight.data(), m.final_norm.bias.data(), c.norm_eps,
                        static_cast<int>(rows), static_cast<int>(H), m.h.data(), m.stream);
  m.logits_to_host(m.h.data(), rows, logits);
}

RowMatrix CudaTransformer::forward(std::span<const int64_t> tokens, const ExtendOptions& opt) const {
  RowMatrix logits(opt.all_logits ? static_cast<int64_t>(tokens.size()) : 1, config().vocab_size);
  forward(tokens, opt, logits.data());
  return logits;
}

void CudaTransformer::forward(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const {
  State& state = impl_->forward_state;  // its device cache is kept for the next pass
  state.length = 0;
  state.tokens.clear();
  extend(state, tokens, opt, logits);
}

}  // namespace kvb::cuda
