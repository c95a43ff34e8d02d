#include "kernels/attention_rows.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/cuda_check.h"
#include "sim/metrics/attention_shift.h"

namespace kvb::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;

// ---------------------------------------------------------------------------
// Block reductions (every thread gets the result).
// ---------------------------------------------------------------------------
__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kRowWarps; ++w) total += scratch[w];  // fixed order: deterministic
  return total;
}

__device__ double block_max(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double m = -INFINITY;
  for (int w = 0; w < kRowWarps; ++w) m = fmax(m, scratch[w]);
  return m;
}

// ---------------------------------------------------------------------------
// Top-k with the CPU's order (sim/simulator.cpp topk_overlap): larger value first,
// equal values by lower index.
// ---------------------------------------------------------------------------
struct Cand {
  double v;
  int i;
};

__device__ __forceinline__ bool better(Cand a, Cand b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
__device__ __forceinline__ Cand no_cand() { return Cand{-INFINITY, INT_MAX}; }

// A thread's own k best of the keys it visits, sorted best first (local memory).
struct LocalTopK {
  Cand c[kMaxTopK];
  int count = 0;

  __device__ void offer(Cand x, int k) {
    if (k <= 0 || (count == k && !better(x, c[k - 1]))) return;  // k <= 0: overlap is 1, as on the CPU
    int at = count < k ? count++ : k - 1;
    while (at > 0 && better(x, c[at - 1])) {
      c[at] = c[at - 1];
      --at;
    }
    c[at] = x;
  }
};

// Warp argmax (by `better`) of one candidate per lane; every lane gets the winner.
__device__ Cand warp_best(Cand x) {
  for (int o = 16; o > 0; o >>= 1) {
    Cand y;
    y.v = __shfl_xor_sync(0xffffffffu, x.v, o);
    y.i = __shfl_xor_sync(0xffffffffu, x.i, o);
    if (better(y, x)) x = y;
  }
  return x;
}

// k rounds of warp argmax over the lanes' sorted lists `list(lane)[0..len(lane))`:
// writes the warp's k best, best first, to out[0..k) (lane 0 writes).
template <typename ListAt, typename ListLen>
__device__ void warp_merge(int k, ListAt list_at, ListLen list_len, Cand* out) {
  const int lane = threadIdx.x & 31;
  int head = 0;
  const int len = list_len(lane);
  for (int r = 0; r < k; ++r) {
    const Cand mine = head < len ? list_at(lane, head) : no_cand();
    const Cand best = warp_best(mine);
    if (head < len && mine.i == best.i && best.i != INT_MAX) ++head;
    if (lane == 0) out[r] = best;
  }
}

// Block top-k of the threads' local lists into out[0..k).
__device__ void block_topk(const LocalTopK& mine, int k, Cand (*warp_lists)[kMaxTopK], Cand* out) {
  const int warp = threadIdx.x >> 5;
  warp_merge(
      k, [&](int, int h) { return mine.c[h]; }, [&](int) { return mine.count; }, warp_lists[warp]);
  __syncthreads();
  if (warp == 0)
    warp_merge(
        k, [&](int lane, int h) { return warp_lists[lane][h]; }, [&](int lane) { return lane < kRowWarps ? k : 0; },
        out);
  __syncthreads();
}

// ---------------------------------------------------------------------------
// One block per row r of a row block: query head head0 + r / npos at position
// t = positions[r % npos] over keys j <= t.
// ---------------------------------------------------------------------------

// The values of an AttentionRow (sim/metrics/error_stats.h) these kernels fill:
// attention_rows_kernel kl, topk_overlap, logit_err2, logit_err_max;
// output_norms_kernel out_norm2, out_err2. A new value must be filled here too.
static_assert(sizeof(kAttentionRowValues) / sizeof(kAttentionRowValues[0]) == 6,
              "a new AttentionRow value: fill it in attention_rows_kernel or output_norms_kernel");

enum class Seen { Exact, Stored, Window };

__global__ void __launch_bounds__(kRowThreads) attention_rows_kernel(RowBlockArgs a) {
  __shared__ double scratch[kRowWarps];
  __shared__ Cand warp_lists[kRowWarps][kMaxTopK];
  __shared__ Cand top_p[kMaxTopK], top_phat[kMaxTopK];
  __shared__ int common;

  const int r = blockIdx.x;
  const int i = r % a.npos;
  const int64_t t = a.positions[i];
  const int64_t n = t + 1;
  const int64_t row_off = static_cast<int64_t>(r) * a.ld;
  const float* s = a.scores + row_off;
  const float* ds_stored = a.dscores + row_off;
  const float* ds_window = a.dscores_win ? a.dscores_win + row_off : nullptr;

  // Which version of token j this query sees (sim/plan.h, row_versions): j >= *_from
  // is in the residual, read in the window's version when the unit has a window, else exact.
  const bool exact = t < a.prefill;
  const int64_t key_from = a.key_residual_from[i];
  const int64_t value_from = a.value_residual_from[i];
  auto ds_at = [&](int64_t j) -> float {
    if (exact) return 0.0f;
    if (j >= key_from) return ds_window ? ds_window[j] : 0.0f;
    return ds_stored[j];
  };

  // Pass 1: max score.
  double mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmax(mx, static_cast<double>(s[j]));
  mx = block_max(mx, scratch);

  // Pass 2: normaliser and the sums of A, Σ p Δs, logit errors.
  double z = 0, sum_e_ds = 0, sum_e_expm1 = 0, err2 = 0, max_abs_ds = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double ds = ds_at(j);
    const double e = exp(static_cast<double>(s[j]) - mx);
    z += e;
    sum_e_ds += e * ds;
    sum_e_expm1 += e * expm1(ds);
    err2 += ds * ds;
    max_abs_ds = fmax(max_abs_ds, fabs(ds));
  }
  z = block_sum(z, scratch);
  const double mean_ds = block_sum(sum_e_ds, scratch) / z;
  const double A = block_sum(sum_e_expm1, scratch) / z;
  err2 = block_sum(err2, scratch);
  max_abs_ds = block_max(max_abs_ds, scratch);

  // Pass 3 (large shifts only): max and normaliser of the perturbed logits ŝ = s + Δs.
  const bool large = attn_large_shift(max_abs_ds);
  double zhat = 0, max_shat = -INFINITY;
  if (large) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      max_shat = fmax(max_shat, static_cast<double>(s[j]) + static_cast<double>(ds_at(j)));
    max_shat = block_max(max_shat, scratch);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      zhat += exp(static_cast<double>(s[j]) + static_cast<double>(ds_at(j)) - max_shat);
    zhat = block_sum(zhat, scratch);
  }

  // Pass 4: p, p̂ - p and p̂ by value version; each thread's top-k of p and p̂.
  const int k = static_cast<int>(min(static_cast<int64_t>(a.topk), n));
  LocalTopK top_mine_p, top_mine_phat;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double ds = ds_at(j);
    const double p = exp(static_cast<double>(s[j]) - mx) / z;
    const double dp = large ? exp(static_cast<double>(s[j]) + ds - max_shat) / zhat - p
                            : attn_dprob_small_shift(p, ds, A);
    const double phat = p + dp;
    const Seen v = exact ? Seen::Exact
                   : j < value_from ? Seen::Stored
                   : a.phat_win     ? Seen::Window
                                    : Seen::Exact;
    a.probs[row_off + j] = static_cast<float>(p);
    a.dprobs[row_off + j] = static_cast<float>(dp);
    a.phat_stored[row_off + j] = v == Seen::Stored ? static_cast<float>(phat) : 0.0f;
    if (a.phat_win) a.phat_win[row_off + j] = v == Seen::Window ? static_cast<float>(phat) : 0.0f;
    top_mine_p.offer(Cand{p, static_cast<int>(j)}, k);
    top_mine_phat.offer(Cand{phat, static_cast<int>(j)}, k);
  }
  for (int64_t j = n + threadIdx.x; j < a.ld; j += blockDim.x) {
    a.probs[row_off + j] = 0.0f;
    a.dprobs[row_off + j] = 0.0f;
    a.phat_stored[row_off + j] = 0.0f;
    if (a.phat_win) a.phat_win[row_off + j] = 0.0f;
  }

  block_topk(top_mine_p, k, warp_lists, top_p);
  block_topk(top_mine_phat, k, warp_lists, top_phat);
  if (threadIdx.x == 0) common = 0;
  __syncthreads();
  if (threadIdx.x < k) {
    bool found = false;
    for (int m = 0; m < k; ++m) found |= top_phat[m].i == top_p[threadIdx.x].i;
    if (found) atomicAdd(&common, 1);
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    const double kl = large ? attn_kl_large_shift(zhat, max_shat, z, mx, mean_ds) : attn_kl_small_shift(A, mean_ds);
    AttentionRow& out = a.out_rows[static_cast<int64_t>(a.head0 + r / a.npos) * a.out_npos + a.out_pos0 + i];
    out.layer = a.layer;
    out.q_head = a.head0 + r / a.npos;
    out.position = static_cast<int32_t>(t);
    out.kl = static_cast<float>(fmax(0.0, kl));
    out.topk_overlap = k > 0 ? static_cast<float>(common) / static_cast<float>(k) : 1.0f;
    out.logit_err2 = static_cast<float>(err2);
    out.logit_err_max = static_cast<float>(max_abs_ds);
  }
}

// One warp per row: ||o||² and ||Δo||² in double.
__global__ void output_norms_kernel(const float* __restrict__ o, const float* __restrict__ dout, int rows, int d,
                                    RowBlockArgs a) {
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  double on = 0, en = 0;
  for (int c = lane; c < d; c += 32) {
    const double ov = o[static_cast<int64_t>(r) * d + c], ev = dout[static_cast<int64_t>(r) * d + c];
    on += ov * ov;
    en += ev * ev;
  }
  for (int off = 16; off > 0; off >>= 1) {
    on += __shfl_xor_sync(0xffffffffu, on, off);
    en += __shfl_xor_sync(0xffffffffu, en, off);
  }
  if (lane == 0) {
    AttentionRow& out =
        a.out_rows[static_cast<int64_t>(a.head0 + r / a.npos) * a.out_npos + a.out_pos0 + r % a.npos];
    out.out_norm2 = static_cast<float>(on);
    out.out_err2 = static_cast<float>(en);
  }
}

__global__ void gather_queries_kernel(const float* __restrict__ q, int64_t tokens, int d, int head0, int npos,
                                      const int32_t* __restrict__ positions, int64_t total, float* __restrict__ qb) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d;
    const int c = static_cast<int>(e - r * d);
    const int64_t head = head0 + r / npos;
    qb[e] = q[(head * tokens + positions[r % npos]) * d + c];
  }
}

__global__ void __launch_bounds__(256) delta_kernel(const float* __restrict__ x, float* __restrict__ xhat, int64_t n,
                                                    double* __restrict__ partial) {
  __shared__ double s_err[8], s_norm[8];
  double err2 = 0, norm2 = 0;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float xv = x[e];
    const float dv = xhat[e] - xv;  // as the CPU's u.stored[i] -= x[i]
    xhat[e] = dv;
    err2 += static_cast<double>(dv) * dv;
    norm2 += static_cast<double>(xv) * xv;
  }
  for (int o = 16; o > 0; o >>= 1) {
    err2 += __shfl_xor_sync(0xffffffffu, err2, o);
    norm2 += __shfl_xor_sync(0xffffffffu, norm2, o);
  }
  if ((threadIdx.x & 31) == 0) {
    s_err[threadIdx.x >> 5] = err2;
    s_norm[threadIdx.x >> 5] = norm2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double e = 0, m = 0;
    for (int w = 0; w < 8; ++w) {
      e += s_err[w];
      m += s_norm[w];
    }
    partial[2 * blockIdx.x] = e;
    partial[2 * blockIdx.x + 1] = m;
  }
}

}  // namespace

void launch_attention_rows(const RowBlockArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  attention_rows_kernel<<<a.rows, kRowThreads, 0, stream>>>(a);
  KVB_CUDA_CHECK_LAUNCH(attention_rows_kernel);
}

void launch_output_norms(const float* o, const float* dout, int rows, int d, const RowBlockArgs& a,
                         cudaStream_t stream) {
  if (rows == 0) return;
  const int warps = 8;
  output_norms_kernel<<<(rows + warps - 1) / warps, warps * 32, 0, stream>>>(o, dout, rows, d, a);
  KVB_CUDA_CHECK_LAUNCH(output_norms_kernel);
}

void launch_gather_queries(const float* q, int64_t tokens, int d, int head0, int heads, const int32_t* positions,
                           int npos, float* qb, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(heads) * npos * d;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 1 << 16);
  gather_queries_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(q, tokens, d, head0, npos, positions,
                                                                           total, qb);
  KVB_CUDA_CHECK_LAUNCH(gather_queries_kernel);
}

void launch_delta(const float* x, float* xhat, int64_t n, double* partial, cudaStream_t stream) {
  delta_kernel<<<kDeltaBlocks, 256, 0, stream>>>(x, xhat, n, partial);
  KVB_CUDA_CHECK_LAUNCH(delta_kernel);
}

}  // namespace kvb::cuda
