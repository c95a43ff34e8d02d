#include "kernels/cuda_simulator.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
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

// Score-like matrices of one row block stay under this many floats each.
constexpr int64_t kMaxBlockElements = int64_t{48} << 20;
constexpr int64_t kMaxBlockRows = 4096;

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
  // Per layer, device: query [q_heads, T, d], key and value [kv_heads, T, d].
  std::vector<DeviceBuffer<float>> query, key, value;
  // One unit's reconstruction errors x̂ - x, [T, d] device.
  DeviceBuffer<float> dk_stored, dk_window, dv_stored, dv_window;
  // [kv_heads, 2 (K, V), 2 (stored, window), kDeltaBlocks, 2]: (Σ Δ², Σ x²) per block
  // of each unit's stored and window reconstruction (a window slot is written only for
  // a unit with a window; only the stored sums are tensor-level errors).
  DeviceBuffer<double> partial;
  // Row block scratch, device: queries [rows, d]; score-like [rows, keys]; outputs [rows, d].
  DeviceBuffer<float> qb, scores, dscores, dscores_win, phat_stored, phat_win, out, dout;
  DeviceBuffer<int32_t> positions;
  DeviceBuffer<int32_t> key_residual_from, value_residual_from;  // [npos] of the current KV head
  DeviceBuffer<AttentionRow> rows;  // [q_heads, npos]
  TwinCache twins;

  explicit Impl(const Recording& r) : rec(r) {}
  ~Impl() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // x̂ - x of one unit's stored version into `delta` [T, d]; the window version into
  // `delta_win` when the unit has a window. Writes per-block (Σ Δ², Σ x²) of the stored
  // version at `partial_at`, of the window version after it (2 · kDeltaBlocks on).
  void unit_delta(const UnitPlan& u, const float* x, DeviceBuffer<float>& delta, DeviceBuffer<float>& delta_win,
                  double* partial_at) {
    const int64_t T = rec.tokens, d = rec.head_dim;
    delta.reserve(static_cast<size_t>(T * d));
    if (u.window.active()) delta_win.reserve(static_cast<size_t>(T * d));
    reconstruct_unit_on_device(twins, u, x, T, d, delta.data(), u.window.active() ? delta_win.data() : nullptr, stream);
    launch_delta(x, delta.data(), T * d, partial_at, stream);
    if (u.window.active()) launch_delta(x, delta_win.data(), T * d, partial_at + 2 * kDeltaBlocks, stream);
  }

  // The error of the query heads of KV heads [g_begin, g_end) of one layer, rows in
  // (q_head, position) order; the tensor-level sums of their units. With
  // `require_finite`, throws NonFiniteReconstruction when a unit's stored or window
  // reconstruction is not finite (else such values reach the rows as Inf or NaN).
  ErrorStats simulate_heads(const Plan& plan, int64_t layer, int64_t g_begin, int64_t g_end, const SimOptions& opt,
                            bool require_finite);
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

CudaSimulator::CudaSimulator(const Recording& rec) : impl_(std::make_unique<Impl>(rec)) {
  if (rec.has_sparse_queries())
    throw Error("CUDA backend: the recording keeps the queries of sampled positions only (a CPU run's long "
                "context); the CUDA simulator needs every position's query");
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
  for (size_t l = 0; l < L; ++l) {
    impl_->query[l].upload(rec.layers[l].query.data);
    impl_->key[l].upload(rec.layers[l].key.data);
    impl_->value[l].upload(rec.layers[l].value.data);
  }
  impl_->partial.resize(static_cast<size_t>(rec.kv_heads) * 8 * kDeltaBlocks);
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

ErrorStats CudaSimulator::Impl::simulate_heads(const Plan& plan, int64_t layer, int64_t g_begin, int64_t g_end,
                                               const SimOptions& opt, bool require_finite) {
  Impl& m = *this;
  const Recording& rec = m.rec;
  if (plan.layers() != rec.num_layers() || plan.kv_heads() != rec.kv_heads || plan.tokens() != rec.tokens ||
      plan.head_dim() != rec.head_dim)
    throw Error("internal: plan shape does not match the recording on the device");
  if (const std::string why = unsupported_reason(plan, opt); !why.empty()) throw Error("CUDA backend: " + why);
  const int64_t T = rec.tokens, d = rec.head_dim, G = rec.group_size(), prefill = plan.prefill();
  const size_t li = static_cast<size_t>(layer);

  std::vector<int32_t> pos;
  if (opt.positions.empty()) {
    pos.resize(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), 0);
  } else {
    for (int64_t p : opt.positions) pos.push_back(static_cast<int32_t>(p));
  }
  const int npos = static_cast<int>(pos.size());
  m.positions.reserve(pos.size());
  m.positions.upload(pos.data(), pos.size());
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
  for (int64_t g = g_begin; g < g_end; ++g)
    for (size_t i = 0; i < pos.size(); ++i) {
      const size_t at = static_cast<size_t>(g) * pos.size() + i;
      key_from[at] = static_cast<int32_t>(row_versions(plan.unit(layer, g, Kind::Key), prefill, pos[i]).residual_begin);
      value_from[at] =
          static_cast<int32_t>(row_versions(plan.unit(layer, g, Kind::Value), prefill, pos[i]).residual_begin);
    }
  m.key_residual_from.reserve(key_from.size());
  m.value_residual_from.reserve(value_from.size());
  m.key_residual_from.upload(key_from.data(), key_from.size());
  m.value_residual_from.upload(value_from.data(), value_from.size());

  for (int64_t g = g_begin; g < g_end; ++g) {
    const UnitPlan& ku = plan.unit(layer, g, Kind::Key);
    const UnitPlan& vu = plan.unit(layer, g, Kind::Value);
    const float* K = m.key[li].data() + g * T * d;
    const float* V = m.value[li].data() + g * T * d;
    m.unit_delta(ku, K, m.dk_stored, m.dk_window, m.partial.data() + (g * 8 + 0) * kDeltaBlocks);
    m.unit_delta(vu, V, m.dv_stored, m.dv_window, m.partial.data() + (g * 8 + 4) * kDeltaBlocks);
    const bool key_window = ku.window.active(), value_window = vu.window.active();

    for (int b0 = 0; b0 < npos;) {
      // As many positions as fit the block limits (at least one).
      int b1 = b0 + 1;
      while (b1 < npos && G * (b1 + 1 - b0) <= kMaxBlockRows &&
             G * (b1 + 1 - b0) * (static_cast<int64_t>(pos[static_cast<size_t>(b1)]) + 1) <= kMaxBlockElements)
        ++b1;
      const int bn = b1 - b0;
      const int64_t rows = G * bn, keys = static_cast<int64_t>(pos[static_cast<size_t>(b1 - 1)]) + 1;
      const size_t mat = static_cast<size_t>(rows * keys);
      m.qb.reserve(static_cast<size_t>(rows * d));
      m.scores.reserve(mat);
      m.dscores.reserve(mat);
      m.phat_stored.reserve(mat);
      if (key_window) m.dscores_win.reserve(mat);
      if (value_window) m.phat_win.reserve(mat);
      m.out.reserve(static_cast<size_t>(rows * d));
      m.dout.reserve(static_cast<size_t>(rows * d));

      launch_gather_queries(m.query[li].data(), T, static_cast<int>(d), static_cast<int>(g * G), static_cast<int>(G),
                            m.positions.data() + b0, bn, m.qb.data(), m.stream);
      const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));  // as the CPU simulator
      gemm_abt(m.blas, rows, keys, d, inv_sqrt_d, m.qb.data(), K, 0.0f, m.scores.data());
      gemm_abt(m.blas, rows, keys, d, inv_sqrt_d, m.qb.data(), m.dk_stored.data(), 0.0f, m.dscores.data());
      if (key_window)
        gemm_abt(m.blas, rows, keys, d, inv_sqrt_d, m.qb.data(), m.dk_window.data(), 0.0f, m.dscores_win.data());

      RowBlockArgs a;
      a.scores = m.scores.data();
      a.dscores = m.dscores.data();
      a.dscores_win = key_window ? m.dscores_win.data() : nullptr;
      a.probs = m.scores.data();    // p over s
      a.dprobs = m.dscores.data();  // p̂ - p over Δs
      a.phat_stored = m.phat_stored.data();
      a.phat_win = value_window ? m.phat_win.data() : nullptr;
      a.ld = keys;
      a.positions = m.positions.data() + b0;
      a.npos = bn;
      a.rows = static_cast<int>(rows);
      a.prefill = prefill;
      a.key_residual_from = m.key_residual_from.data() + g * npos + b0;
      a.value_residual_from = m.value_residual_from.data() + g * npos + b0;
      a.topk = static_cast<int>(opt.topk);
      a.layer = static_cast<int32_t>(layer);
      a.head0 = static_cast<int32_t>(g * G);
      a.out_rows = m.rows.data();
      a.out_npos = npos;
      a.out_pos0 = b0;
      launch_attention_rows(a, m.stream);

      // o = P·V;  Δo = (P̂ - P)·V + P̂_stored·ΔV_stored (+ P̂_window·ΔV_window)
      gemm_ab(m.blas, rows, d, keys, 1.0f, m.scores.data(), V, 0.0f, m.out.data());
      gemm_ab(m.blas, rows, d, keys, 1.0f, m.dscores.data(), V, 0.0f, m.dout.data());
      gemm_ab(m.blas, rows, d, keys, 1.0f, m.phat_stored.data(), m.dv_stored.data(), 1.0f, m.dout.data());
      if (value_window)
        gemm_ab(m.blas, rows, d, keys, 1.0f, m.phat_win.data(), m.dv_window.data(), 1.0f, m.dout.data());
      launch_output_norms(m.out.data(), m.dout.data(), static_cast<int>(rows), static_cast<int>(d), a, m.stream);
      b0 = b1;
    }
  }

  KVB_CUDA_CHECK(cudaStreamSynchronize(m.stream));
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

ErrorStats CudaSimulator::simulate(const Plan& plan, const SimOptions& opt) {
  const std::string bad = plan.check();
  if (!bad.empty()) throw Error("invalid plan: " + bad);
  ErrorStats all;
  for (int64_t l = 0; l < impl_->rec.num_layers(); ++l) all.merge(simulate_layer(plan, l, opt));
  return all;
}

}  // namespace kvb::cuda
