#include "kernels/cuda_simulator.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>

#include "kernels/attention_rows.h"
#include "kernels/cublas_check.h"
#include "kernels/cuda_check.h"
#include "kernels/device.h"
#include "kernels/device_buffer.h"
#include "kernels/format_twin.h"
#include "kernels/unit_reconstruction.h"
#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/reconstruction.h"

namespace kvb::cuda {

namespace {

// Score-like matrices of one row block (all KV heads of its batch) stay under this
// many floats each, and under kMaxBlockRows rows.
constexpr int64_t kMaxBlockElements = int64_t{48} << 20;
constexpr int64_t kMaxBlockRows = 8192;
// A row block's rows per KV head: at most kMaxHeadRows, and it stops growing once its
// key columns cover more than kMaxCausalWaste times the (row, key) pairs its rows read
// (the rest lie above the diagonal), once it has kMinHeadRows rows.
constexpr int64_t kMaxHeadRows = 1024;
constexpr int64_t kMinHeadRows = 256;
constexpr double kMaxCausalWaste = 1.5;

// Row-major GEMMs through column-major cuBLAS (fp32 throughout, no TF32).
// c [m, n] = alpha · a [m, k] · b[n, k]ᵀ + beta · c
void gemm_abt(cublasHandle_t h, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
              float beta, float* c) {
  KVB_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, b, static_cast<int>(k), a, static_cast<int>(k), &beta, c,
                               static_cast<int>(n)));
}
// c [m, n] = alpha · a [m, k] · b [k, n] + beta · c
void gemm_ab(cublasHandle_t h, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
             float beta, float* c) {
  KVB_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, b, static_cast<int>(n), a, static_cast<int>(k), &beta, c,
                               static_cast<int>(n)));
}

// Strided batches of the two above: matrix b of a, b, c at a + b * stride_a, ...
void gemm_abt_batched(cublasHandle_t h, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t stride_a, const float* b, int64_t stride_b, float beta, float* c, int64_t stride_c,
                      int64_t batch) {
  KVB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                             static_cast<int>(k), &alpha, b, static_cast<int>(k), stride_b, a,
                                             static_cast<int>(k), stride_a, &beta, c, static_cast<int>(n), stride_c,
                                             static_cast<int>(batch)));
}
void gemm_ab_batched(cublasHandle_t h, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t stride_a,
                     const float* b, int64_t stride_b, float beta, float* c, int64_t stride_c, int64_t batch) {
  KVB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                             static_cast<int>(k), &alpha, b, static_cast<int>(n), stride_b, a,
                                             static_cast<int>(k), stride_a, &beta, c, static_cast<int>(n), stride_c,
                                             static_cast<int>(batch)));
}

// The evaluated positions [b0, b1) of the next row block from b0: as many as the block
// limits allow, at least one. heads = query heads of the batch, group = per KV head.
int next_block_end(const std::vector<int32_t>& pos, int b0, int64_t heads, int64_t group) {
  const int npos = static_cast<int>(pos.size());
  int64_t pairs = static_cast<int64_t>(pos[static_cast<size_t>(b0)]) + 1;  // Σ (t + 1) over the block's positions
  int b1 = b0 + 1;
  while (b1 < npos) {
    const int64_t bn = b1 + 1 - b0, keys = static_cast<int64_t>(pos[static_cast<size_t>(b1)]) + 1;
    if (heads * bn > kMaxBlockRows || heads * bn * keys > kMaxBlockElements || group * bn > kMaxHeadRows) break;
    if (group * bn > kMinHeadRows && static_cast<double>(bn * keys) > kMaxCausalWaste * static_cast<double>(pairs + keys))
      break;
    pairs += keys;
    ++b1;
  }
  return b1;
}

}  // namespace

std::string unsupported_reason(const Plan& plan, const SimOptions& opt) {
  if (opt.topk > kMaxTopK)
    return "metrics.topk = " + std::to_string(opt.topk) + " exceeds the CUDA backend's maximum of " +
           std::to_string(kMaxTopK);
  if (opt.region != nullptr) return "error attribution regions are computed on the CPU only";
  if (plan.tokens() >= INT32_MAX) return "recordings of 2^31 tokens or more are not supported by the CUDA backend";
  return missing_twin(plan);
}

struct CudaSimulator::Impl {
  const Recording& rec;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  // Per layer, device: query [q_heads, query rows, d] (every position, or the sampled
  // ones of LayerTensors::query_positions), key and value [kv_heads, T, d]. Every layer
  // is on the device, or with `layers_streamed` only those upload_layer put there (the
  // streamed recording's held layer).
  std::vector<DeviceBuffer<float>> query, key, value;
  bool layers_streamed = false;
  std::vector<char> on_device;  // [layers]
  // Reconstruction errors x̂ - x of a batch of units, [batch, T, d] device.
  DeviceBuffer<float> dk_stored, dk_window, dv_stored, dv_window;
  // [kv_heads, 2 (K, V), 2 (stored, window), kDeltaBlocks, 2]: (Σ Δ², Σ x²) per block
  // of each unit's stored and window reconstruction (a window slot is written only for
  // a unit with a window; only the stored sums are tensor-level errors).
  DeviceBuffer<double> partial;
  // Row block scratch, device: queries [rows, d]; score-like [rows, keys]; outputs [rows, d].
  DeviceBuffer<float> qb, scores, probs, dscores, dscores_win, phat_stored, phat_win, out, dout;
  DeviceBuffer<ExactRowStats> exact_stats;  // [rows] of a block whose exact pass is not cached
  DeviceBuffer<int32_t> exact_topk;         // [rows, topk] likewise
  DeviceBuffer<int32_t> positions, query_rows;                  // [npos]
  DeviceBuffer<int32_t> key_residual_from, value_residual_from;  // [kv_heads, npos]
  DeviceBuffer<AttentionRow> rows;  // [q_heads, npos]
  // ||o||² of the exact attention per layer, [q_heads, npos] device, for the positions
  // it was computed at, valid for the KV heads marked: the same for every plan, so a
  // sweep computes o = P·V once per layer instead of at every point.
  struct ExactNorms {
    std::vector<int32_t> positions;
    std::vector<char> valid;  // [kv_heads]
    DeviceBuffer<float> norm2;
  };
  std::vector<ExactNorms> exact_norms;
  // The exact pass of row blocks, the same for every plan: the scores s = Q·Kᵀ/√d
  // [batch, rows, keys], each row's ExactRowStats and top-k of p. Key (layer, first KV
  // head of the batch, KV heads in it, first position, top-k), for `positions`; kept
  // while they fit `budget` bytes, else computed for each plan. Cached or not, they are
  // the same kernels on the same operands: results are identical.
  struct ExactBlock {
    DeviceBuffer<float> scores;
    DeviceBuffer<ExactRowStats> stats;
    DeviceBuffer<int32_t> topk;
    size_t bytes = 0;  // what it counts in ExactCache::bytes
  };
  struct ExactCache {
    std::vector<int32_t> positions;
    std::map<std::array<int64_t, 5>, ExactBlock> blocks;
    size_t bytes = 0, budget = 0;
  } exact_cache;
  MatmulPrecision precision = MatmulPrecision::Fp32;
  TwinCache twins;

  explicit Impl(const Recording& r) : rec(r) {}

  // The math of the products that depend on the plan (Δs, Δo): fp32, or TF32 tensor
  // cores in the declared fast mode. The exact products (s, o) are always fp32.
  void plan_math(bool plan_dependent) {
    const bool tf32 = plan_dependent && precision == MatmulPrecision::Tf32;
    KVB_CUBLAS_CHECK(cublasSetMathMode(blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  // The cached exact pass of a row block ([rows, keys] scores, `rows` stats, [rows,
  // topk] indices), or nullptr when it does not fit; `fresh` tells whether it must be
  // computed (a new entry). Resets the cache when the positions changed.
  ExactBlock* cached_exact(std::array<int64_t, 5> key, const std::vector<int32_t>& pos, size_t scores, size_t rows,
                           size_t topk, bool& fresh);
  ~Impl() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // x̂ - x of one unit's stored version into `delta` [T, d]; the window version into
  // `delta_win` when the unit has a window. Writes per-block (Σ Δ², Σ x²) of the stored
  // version at `partial_at`, of the window version after it (2 · kDeltaBlocks on).
  void unit_delta(const UnitPlan& u, const float* x, float* delta, float* delta_win, double* partial_at) {
    const int64_t T = rec.tokens, d = rec.head_dim;
    reconstruct_unit_on_device(twins, u, x, T, d, delta, u.window.active() ? delta_win : nullptr, stream);
    launch_delta(x, delta, T * d, partial_at, stream);
    if (u.window.active()) launch_delta(x, delta_win, T * d, partial_at + 2 * kDeltaBlocks, stream);
  }

  // Layer l's tensors to the device, or off it with what was kept for it.
  void upload_layer(int64_t l);
  void drop_layer(int64_t l);

  // The row of each evaluated position's query in the layer's query tensor.
  std::vector<int32_t> query_rows_of(const LayerTensors& lt, const std::vector<int32_t>& pos) const;

  // The exact-attention norms of `layer` for `pos`, reset when the positions changed.
  ExactNorms& exact_norms_for(int64_t layer, const std::vector<int32_t>& pos);

  // The error of the query heads of KV heads [g_begin, g_end) of one layer, rows in
  // (q_head, position) order; the tensor-level sums of their units. With
  // `require_finite`, throws NonFiniteReconstruction when a unit's stored or window
  // reconstruction is not finite (else such values reach the rows as Inf or NaN).
  ErrorStats simulate_heads(const Plan& plan, int64_t layer, int64_t g_begin, int64_t g_end, const SimOptions& opt,
                            bool require_finite);
  // The rows of one batch of KV heads [gb, ge) whose units agree on having a key window
  // and a value window (so that their GEMMs form one strided batch).
  void simulate_batch(const Plan& plan, int64_t layer, int64_t gb, int64_t ge, const std::vector<int32_t>& pos,
                      const SimOptions& opt, ExactNorms& norms);
};

namespace {

// Per-block (Σ Δ², Σ x²) pairs of one reconstruction, summed in block order.
void sum_partial(const double* p, double& err2, double& norm2) {
  for (int b = 0; b < kDeltaBlocks; ++b) {
    err2 += p[2 * b];
    norm2 += p[2 * b + 1];
  }
}

}  // namespace

CudaSimulator::CudaSimulator(const Recording& rec, MatmulPrecision precision, bool layers_streamed)
    : impl_(std::make_unique<Impl>(rec)) {
  impl_->precision = precision;
  impl_->layers_streamed = layers_streamed;
  const DeviceInfo dev = device_info();
  if (!dev.available) throw Error("CUDA backend: no usable CUDA device (" + dev.why_not + ")");
  KVB_CUDA_CHECK(cudaSetDevice(0));
  // A blocking stream: the synchronous host transfers below wait for its work.
  KVB_CUDA_CHECK(cudaStreamCreate(&impl_->stream));
  KVB_CUBLAS_CHECK(cublasCreate(&impl_->blas));
  KVB_CUBLAS_CHECK(cublasSetStream(impl_->blas, impl_->stream));
  KVB_CUBLAS_CHECK(cublasSetMathMode(impl_->blas, CUBLAS_DEFAULT_MATH));  // true fp32, never TF32
  const size_t L = rec.layers.size();
  impl_->query.resize(L);
  impl_->key.resize(L);
  impl_->value.resize(L);
  impl_->on_device.assign(L, 0);
  if (!layers_streamed)
    for (size_t l = 0; l < L; ++l) impl_->upload_layer(static_cast<int64_t>(l));
  impl_->partial.resize(static_cast<size_t>(rec.kv_heads) * 8 * kDeltaBlocks);
  impl_->exact_norms.resize(L);
  // The score cache may take half of what the recording left free (streamed: less the
  // largest layer, which is not uploaded yet), less room for the row blocks' scratch
  // (six score-like matrices).
  size_t free_b = 0, total_b = 0;
  KVB_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  size_t reserved = 6 * static_cast<size_t>(kMaxBlockElements) * sizeof(float);
  if (layers_streamed) {
    size_t largest = 0;
    for (const LayerTensors& lt : rec.layers) {
      const size_t rows = lt.sparse_queries() ? lt.query_positions.size() : static_cast<size_t>(rec.tokens);
      const size_t kv = static_cast<size_t>(rec.kv_heads * rec.tokens);
      const size_t floats = static_cast<size_t>(rec.head_dim) * (static_cast<size_t>(rec.q_heads) * rows + 2 * kv);
      largest = std::max(largest, floats * sizeof(float));
    }
    reserved += largest;
  }
  impl_->exact_cache.budget = free_b > reserved ? (free_b - reserved) / 2 : 0;
}

void CudaSimulator::Impl::upload_layer(int64_t l) {
  const LayerTensors& lt = rec.layers[static_cast<size_t>(l)];
  const size_t kv = static_cast<size_t>(rec.kv_heads * rec.tokens * rec.head_dim);
  if (lt.key.data.size() != kv || lt.value.data.size() != kv)
    throw Error("internal: CUDA backend: layer " + std::to_string(l) +
                "'s keys and values are not held by the recording (a streamed layer is uploaded while held)");
  query[static_cast<size_t>(l)].upload(lt.query.data);
  key[static_cast<size_t>(l)].upload(lt.key.data);
  value[static_cast<size_t>(l)].upload(lt.value.data);
  on_device[static_cast<size_t>(l)] = 1;
}

void CudaSimulator::Impl::drop_layer(int64_t l) {
  const size_t i = static_cast<size_t>(l);
  query[i] = DeviceBuffer<float>{};  // frees, after the work queued on the device
  key[i] = DeviceBuffer<float>{};
  value[i] = DeviceBuffer<float>{};
  on_device[i] = 0;
  exact_norms[i] = ExactNorms{};
  for (auto it = exact_cache.blocks.begin(); it != exact_cache.blocks.end();) {
    if (it->first[0] == l) {
      exact_cache.bytes -= it->second.bytes;
      it = exact_cache.blocks.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {
// upload_layer / drop_layer's preconditions: a streamed simulator, a layer of its recording.
void check_streamed_layer(bool layers_streamed, const Recording& rec, int64_t layer, const char* call) {
  if (!layers_streamed)
    throw Error(std::string("internal: CUDA backend: ") + call + " on a recording uploaded whole");
  if (layer < 0 || layer >= rec.num_layers())
    throw Error("internal: CUDA backend: layer " + std::to_string(layer) + " of " + std::to_string(rec.num_layers()));
}
}  // namespace

void CudaSimulator::upload_layer(int64_t layer) {
  check_streamed_layer(impl_->layers_streamed, impl_->rec, layer, "upload_layer");
  impl_->upload_layer(layer);
}

void CudaSimulator::drop_layer(int64_t layer) {
  check_streamed_layer(impl_->layers_streamed, impl_->rec, layer, "drop_layer");
  impl_->drop_layer(layer);
}

CudaSimulator::~CudaSimulator() = default;

const Recording& CudaSimulator::recording() const { return impl_->rec; }

ErrorStats CudaSimulator::simulate_layer(const Plan& plan, int64_t layer, const SimOptions& opt) {
  return impl_->simulate_heads(plan, layer, 0, impl_->rec.kv_heads, opt, false);
}

ErrorStats CudaSimulator::simulate_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) {
  if (kv_head < 0 || kv_head >= impl_->rec.kv_heads)
    throw Error("internal: CUDA backend: KV head " + std::to_string(kv_head) + " of " +
                std::to_string(impl_->rec.kv_heads));
  return impl_->simulate_heads(plan, layer, kv_head, kv_head + 1, opt, true);
}

std::vector<int32_t> CudaSimulator::Impl::query_rows_of(const LayerTensors& lt, const std::vector<int32_t>& pos) const {
  if (!lt.sparse_queries()) return pos;
  std::vector<int32_t> out(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    const auto it = std::lower_bound(lt.query_positions.begin(), lt.query_positions.end(), int64_t{pos[i]});
    if (it == lt.query_positions.end() || *it != pos[i])
      throw Error("CUDA backend: the query at position " + std::to_string(pos[i]) +
                  " was not kept: this recording keeps the queries of " + std::to_string(lt.query_positions.size()) +
                  " sampled positions only (the run's calibration and evaluated ones)");
    out[i] = static_cast<int32_t>(it - lt.query_positions.begin());
  }
  return out;
}

CudaSimulator::Impl::ExactBlock* CudaSimulator::Impl::cached_exact(std::array<int64_t, 5> key,
                                                                   const std::vector<int32_t>& pos, size_t scores,
                                                                   size_t rows, size_t topk, bool& fresh) {
  ExactCache& c = exact_cache;
  if (c.positions != pos) {
    c.blocks.clear();
    c.bytes = 0;
    c.positions = pos;
  }
  fresh = false;
  if (const auto it = c.blocks.find(key); it != c.blocks.end()) return &it->second;
  const size_t bytes = scores * sizeof(float) + rows * sizeof(ExactRowStats) + rows * topk * sizeof(int32_t);
  if (c.bytes + bytes > c.budget) return nullptr;
  ExactBlock& b = c.blocks[key];
  try {
    b.scores.resize(scores);
    b.stats.resize(rows);
    b.topk.resize(std::max<size_t>(rows * topk, 1));
  } catch (const Error&) {  // the device is fuller than the budget assumed: compute per plan from now on
    c.blocks.erase(key);
    c.budget = c.bytes;
    return nullptr;
  }
  b.bytes = bytes;
  c.bytes += bytes;
  fresh = true;
  return &b;
}

CudaSimulator::Impl::ExactNorms& CudaSimulator::Impl::exact_norms_for(int64_t layer, const std::vector<int32_t>& pos) {
  ExactNorms& e = exact_norms[static_cast<size_t>(layer)];
  if (e.positions != pos) {
    e.positions = pos;
    e.valid.assign(static_cast<size_t>(rec.kv_heads), 0);
    e.norm2.reserve(static_cast<size_t>(rec.q_heads) * pos.size());
  }
  return e;
}

ErrorStats CudaSimulator::Impl::simulate_heads(const Plan& plan, int64_t layer, int64_t g_begin, int64_t g_end,
                                               const SimOptions& opt, bool require_finite) {
  Impl& m = *this;
  const Recording& rec = m.rec;
  if (plan.layers() != rec.num_layers() || plan.kv_heads() != rec.kv_heads || plan.tokens() != rec.tokens ||
      plan.head_dim() != rec.head_dim)
    throw Error("internal: plan shape does not match the recording on the device");
  if (const std::string why = unsupported_reason(plan, opt); !why.empty()) throw Error("CUDA backend: " + why);
  if (layer < 0 || layer >= rec.num_layers() || !m.on_device[static_cast<size_t>(layer)])
    throw Error("internal: CUDA backend: layer " + std::to_string(layer) +
                " is not on the device (a streamed recording's layer is measured while held)");
  const int64_t T = rec.tokens, G = rec.group_size(), prefill = plan.prefill();
  const LayerTensors& lt = rec.layers[static_cast<size_t>(layer)];

  std::vector<int32_t> pos;
  if (opt.positions.empty()) {
    pos.resize(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), 0);
  } else {
    for (int64_t p : opt.positions) pos.push_back(static_cast<int32_t>(p));
  }
  const std::vector<int32_t> qrows = m.query_rows_of(lt, pos);
  m.positions.reserve(pos.size());
  m.positions.upload(pos.data(), pos.size());
  m.query_rows.reserve(qrows.size());
  m.query_rows.upload(qrows.data(), qrows.size());
  m.rows.reserve(static_cast<size_t>(rec.q_heads) * pos.size());
  // All bits set: a float field of AttentionRow no kernel writes reads as NaN, which
  // the sweep's finiteness check and the GPU tests report, never as stale values.
  KVB_CUDA_CHECK(cudaMemsetAsync(m.rows.data(), 0xff, static_cast<size_t>(rec.q_heads) * pos.size() *
                                 sizeof(AttentionRow), m.stream));

  // Per KV head and evaluated position, the first token the query reads at the
  // residual precision in each unit (the CPU's selection, sim/plan.h), [kv_heads, npos]:
  // uploaded once per layer, before any kernel of it.
  std::vector<int32_t> key_from(static_cast<size_t>(rec.kv_heads) * pos.size());
  std::vector<int32_t> value_from(key_from.size());
  for (int64_t g = g_begin; g < g_end; ++g) {
    const size_t at = static_cast<size_t>(g) * pos.size();
    residual_begins(plan.unit(layer, g, Kind::Key), prefill, pos.data(), pos.size(), key_from.data() + at);
    residual_begins(plan.unit(layer, g, Kind::Value), prefill, pos.data(), pos.size(), value_from.data() + at);
  }
  m.key_residual_from.reserve(key_from.size());
  m.value_residual_from.reserve(value_from.size());
  m.key_residual_from.upload(key_from.data(), key_from.size());
  m.value_residual_from.upload(value_from.data(), value_from.size());

  // Batches of consecutive KV heads whose units agree on windows, at most as many as
  // let one position's rows of the whole batch fit a row block.
  ExactNorms& norms = m.exact_norms_for(layer, pos);
  const int64_t max_batch = std::max<int64_t>(1, std::min(kMaxBlockRows / G, kMaxBlockElements / (G * T)));
  auto windows = [&](int64_t g) {
    return std::make_pair(plan.unit(layer, g, Kind::Key).window.active(),
                          plan.unit(layer, g, Kind::Value).window.active());
  };
  for (int64_t gb = g_begin; gb < g_end;) {
    int64_t ge = gb + 1;
    while (ge < g_end && ge - gb < max_batch && windows(ge) == windows(gb)) ++ge;
    m.simulate_batch(plan, layer, gb, ge, pos, opt, norms);
    gb = ge;
  }

  KVB_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (int64_t g = g_begin; g < g_end; ++g) norms.valid[static_cast<size_t>(g)] = 1;
  ErrorStats stats;
  const size_t row0 = static_cast<size_t>(g_begin * G) * pos.size();
  stats.rows = m.rows.download(static_cast<size_t>((g_end - g_begin) * G) * pos.size(), row0);
  for (size_t i = 0; i < stats.rows.size(); ++i) {  // every row written (its identity is)
    const AttentionRow& row = stats.rows[i];
    if (row.layer != layer || row.q_head != static_cast<int32_t>((row0 + i) / pos.size()) ||
        row.position != pos[i % pos.size()])
      throw Error("CUDA backend: attention row " + std::to_string(row0 + i) + " of layer " + std::to_string(layer) +
                  " was not written by the kernels (internal error)");
  }
  const std::vector<double> partial = m.partial.download(static_cast<size_t>(g_end - g_begin) * 8 * kDeltaBlocks,
                                                         static_cast<size_t>(g_begin) * 8 * kDeltaBlocks);
  for (int64_t g = g_begin; g < g_end; ++g)
    for (Kind kind : {Kind::Key, Kind::Value}) {
      const double* at = partial.data() + ((g - g_begin) * 8 + (kind == Kind::Key ? 0 : 4)) * kDeltaBlocks;
      sum_partial(at, kind == Kind::Key ? stats.k_err2 : stats.v_err2,
                  kind == Kind::Key ? stats.k_norm2 : stats.v_norm2);
      if (!require_finite) continue;
      double err2 = 0, norm2 = 0, window_err2 = 0, window_norm2 = 0;
      sum_partial(at, err2, norm2);
      if (plan.unit(layer, g, kind).window.active()) sum_partial(at + 2 * kDeltaBlocks, window_err2, window_norm2);
      if (!std::isfinite(err2) || !std::isfinite(window_err2))
        throw NonFiniteReconstruction("CUDA backend: layer " + std::to_string(layer) + " kv_head " +
                                      std::to_string(g) + " " + kind_name(kind) +
                                      ": a format turned finite values into Inf or NaN (values beyond its range)");
    }
  int64_t pairs = 0;
  for (int32_t t : pos) pairs += static_cast<int64_t>(t) + 1;
  stats.logit_pairs = pairs * G * (g_end - g_begin);
  return stats;
}

void CudaSimulator::Impl::simulate_batch(const Plan& plan, int64_t layer, int64_t gb, int64_t ge,
                                         const std::vector<int32_t>& pos, const SimOptions& opt, ExactNorms& norms) {
  Impl& m = *this;
  const int64_t T = rec.tokens, d = rec.head_dim, G = rec.group_size(), batch = ge - gb, unit = T * d;
  const size_t li = static_cast<size_t>(layer);
  const int64_t query_tokens = rec.layers[li].query.dim(1);
  const bool key_window = plan.unit(layer, gb, Kind::Key).window.active();
  const bool value_window = plan.unit(layer, gb, Kind::Value).window.active();
  bool need_exact = false;  // o = P·V, when some KV head of the batch has no cached norms
  for (int64_t g = gb; g < ge; ++g) need_exact |= norms.valid[static_cast<size_t>(g)] == 0;

  m.dk_stored.reserve(static_cast<size_t>(batch * unit));
  m.dv_stored.reserve(static_cast<size_t>(batch * unit));
  if (key_window) m.dk_window.reserve(static_cast<size_t>(batch * unit));
  if (value_window) m.dv_window.reserve(static_cast<size_t>(batch * unit));
  for (int64_t g = gb; g < ge; ++g) {
    const int64_t at = (g - gb) * unit;
    m.unit_delta(plan.unit(layer, g, Kind::Key), m.key[li].data() + g * unit, m.dk_stored.data() + at,
                 key_window ? m.dk_window.data() + at : nullptr, m.partial.data() + (g * 8 + 0) * kDeltaBlocks);
    m.unit_delta(plan.unit(layer, g, Kind::Value), m.value[li].data() + g * unit, m.dv_stored.data() + at,
                 value_window ? m.dv_window.data() + at : nullptr, m.partial.data() + (g * 8 + 4) * kDeltaBlocks);
  }
  const float* K = m.key[li].data() + gb * unit;
  const float* V = m.value[li].data() + gb * unit;

  const int npos = static_cast<int>(pos.size());
  for (int b0 = 0; b0 < npos;) {
    const int b1 = next_block_end(pos, b0, batch * G, G);
    const int bn = b1 - b0;
    const int64_t head_rows = G * bn, rows = batch * head_rows;
    const int64_t keys = static_cast<int64_t>(pos[static_cast<size_t>(b1 - 1)]) + 1;
    const int64_t mat = head_rows * keys;  // one KV head's score-like matrix
    m.qb.reserve(static_cast<size_t>(rows * d));
    if (need_exact) m.probs.reserve(static_cast<size_t>(batch * mat));  // p, for o = P·V
    m.dscores.reserve(static_cast<size_t>(batch * mat));
    m.phat_stored.reserve(static_cast<size_t>(batch * mat));
    if (key_window) m.dscores_win.reserve(static_cast<size_t>(batch * mat));
    if (value_window) m.phat_win.reserve(static_cast<size_t>(batch * mat));
    if (need_exact) m.out.reserve(static_cast<size_t>(rows * d));
    m.dout.reserve(static_cast<size_t>(rows * d));

    launch_gather_queries(m.query[li].data(), query_tokens, static_cast<int>(d), static_cast<int>(gb * G),
                          static_cast<int>(batch * G), m.query_rows.data() + b0, bn, m.qb.data(), m.stream);
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));  // as the CPU simulator
    const int64_t qstride = head_rows * d;
    // The exact pass: cached across plans when it fits, else computed into the scratch.
    const size_t topk = static_cast<size_t>(std::max<int64_t>(opt.topk, 0));
    bool fresh = true;
    ExactBlock* cached = m.cached_exact({layer, gb, batch, b0, static_cast<int64_t>(topk)}, pos,
                                        static_cast<size_t>(batch * mat), static_cast<size_t>(rows), topk, fresh);
    const bool compute_exact = cached == nullptr || fresh;
    if (!cached) {
      m.scores.reserve(static_cast<size_t>(batch * mat));
      m.exact_stats.reserve(static_cast<size_t>(rows));
      m.exact_topk.reserve(std::max<size_t>(static_cast<size_t>(rows) * topk, 1));
    }
    float* s = cached ? cached->scores.data() : m.scores.data();
    ExactRowStats* stats = cached ? cached->stats.data() : m.exact_stats.data();
    int32_t* exact_topk = cached ? cached->topk.data() : m.exact_topk.data();
    m.plan_math(false);
    if (compute_exact)
      gemm_abt_batched(m.blas, head_rows, keys, d, inv_sqrt_d, m.qb.data(), qstride, K, unit, 0.0f, s, mat, batch);
    if (compute_exact || need_exact) {
      ExactRowsArgs e;
      e.scores = s;
      e.ld = keys;
      e.positions = m.positions.data() + b0;
      e.npos = bn;
      e.rows = static_cast<int>(rows);
      e.topk = static_cast<int>(topk);
      e.probs = need_exact ? m.probs.data() : nullptr;  // for o = P·V
      e.stats = stats;
      e.topk_out = exact_topk;
      launch_exact_rows(e, m.stream);
    }
    m.plan_math(true);
    gemm_abt_batched(m.blas, head_rows, keys, d, inv_sqrt_d, m.qb.data(), qstride, m.dk_stored.data(), unit, 0.0f,
                     m.dscores.data(), mat, batch);
    if (key_window)
      gemm_abt_batched(m.blas, head_rows, keys, d, inv_sqrt_d, m.qb.data(), qstride, m.dk_window.data(), unit, 0.0f,
                       m.dscores_win.data(), mat, batch);

    RowBlockArgs a;
    a.scores = s;
    a.exact = stats;
    a.exact_topk = exact_topk;
    a.dscores = m.dscores.data();
    a.dscores_win = key_window ? m.dscores_win.data() : nullptr;
    a.dprobs = m.dscores.data();                       // p̂ - p over Δs
    a.phat_stored = m.phat_stored.data();
    a.phat_win = value_window ? m.phat_win.data() : nullptr;
    a.ld = keys;
    a.positions = m.positions.data() + b0;
    a.npos = bn;
    a.rows = static_cast<int>(rows);
    a.prefill = plan.prefill();
    a.key_residual_from = m.key_residual_from.data() + gb * npos + b0;
    a.value_residual_from = m.value_residual_from.data() + gb * npos + b0;
    a.residual_stride = npos;
    a.group = static_cast<int>(G);
    a.topk = static_cast<int>(opt.topk);
    a.layer = static_cast<int32_t>(layer);
    a.head0 = static_cast<int32_t>(gb * G);
    a.exact_norm2 = norms.norm2.data();
    a.out_rows = m.rows.data();
    a.out_npos = npos;
    a.out_pos0 = b0;
    launch_attention_rows(a, m.stream);

    // o = P·V (once per layer and positions);  Δo = (P̂ - P)·V + P̂_stored·ΔV_stored (+ P̂_window·ΔV_window)
    const int64_t ostride = head_rows * d;
    if (need_exact) {
      m.plan_math(false);
      gemm_ab_batched(m.blas, head_rows, d, keys, 1.0f, m.probs.data(), mat, V, unit, 0.0f, m.out.data(), ostride,
                      batch);
      m.plan_math(true);
    }
    gemm_ab_batched(m.blas, head_rows, d, keys, 1.0f, m.dscores.data(), mat, V, unit, 0.0f, m.dout.data(), ostride,
                    batch);
    gemm_ab_batched(m.blas, head_rows, d, keys, 1.0f, m.phat_stored.data(), mat, m.dv_stored.data(), unit, 1.0f,
                    m.dout.data(), ostride, batch);
    if (value_window)
      gemm_ab_batched(m.blas, head_rows, d, keys, 1.0f, m.phat_win.data(), mat, m.dv_window.data(), unit, 1.0f,
                      m.dout.data(), ostride, batch);
    launch_output_norms(need_exact ? m.out.data() : nullptr, m.dout.data(), static_cast<int>(rows),
                        static_cast<int>(d), a, m.stream);
    b0 = b1;
  }
}

ErrorStats CudaSimulator::simulate(const Plan& plan, const SimOptions& opt) {
  const std::string bad = plan.check();
  if (!bad.empty()) throw Error("invalid plan: " + bad);
  ErrorStats all;
  for (int64_t l = 0; l < impl_->rec.num_layers(); ++l) all.merge(simulate_layer(plan, l, opt));
  return all;
}

}  // namespace kvb::cuda
