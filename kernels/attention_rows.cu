#include "kernels/attention_rows.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/cuda_check.h"
#include "sim/core/hd_math.h"
#include "sim/metrics/attention_shift.h"

namespace kvb::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;

// ---------------------------------------------------------------------------
// A team of W warps computes one row (W = 1: each warp of a block its own row, for
// rows of up to kWarpRowKeys keys; W = kRowWarps: the whole block, for longer rows).
// Team reductions: every thread of the team gets the result; the order of the terms
// depends only on W, so results are deterministic.
// ---------------------------------------------------------------------------
constexpr int64_t kWarpRowKeys = 4096;

template <int W>
__device__ double team_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (W == 1) {
    return v;
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double total = 0;
    for (int w = 0; w < W; ++w) total += scratch[w];  // fixed order: deterministic
    return total;
  }
}

template <int W>
__device__ double team_max(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (W == 1) {
    return v;
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double m = -INFINITY;
    for (int w = 0; w < W; ++w) m = fmax(m, scratch[w]);
    return m;
  }
}

template <int W>
__device__ void team_sync() {
  if constexpr (W == 1)
    __syncwarp();
  else
    __syncthreads();
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

// A thread's own k best of the keys it visits, sorted best first (local memory; the
// current k-th best also in registers, so that most offers cost one comparison).
struct LocalTopK {
  Cand c[kMaxTopK];
  Cand last{};
  int count = 0;

  __device__ void offer(Cand x, int k) {
    if (x.v != x.v) return;  // NaN never enters (as RegTopK and the CPU's TopK), full list or not
    if (k <= 0 || (count == k && !better(x, last))) return;  // k <= 0: overlap is 1, as on the CPU
    int at = count < k ? count++ : k - 1;
    while (at > 0 && better(x, c[at - 1])) {
      c[at] = c[at - 1];
      --at;
    }
    c[at] = x;
    if (count == k) last = c[k - 1];
  }
  // The merge's view: the best not yet taken, and taking it.
  int taken = 0;
  __device__ Cand head() const { return taken < count ? c[taken] : no_cand(); }
  __device__ void pop() { ++taken; }
};

// The same for k <= kRegTopK, in registers: the thread's kRegTopK best (sentinels
// until filled), sorted best first; offers insert by a compare-swap chain at constant
// indices. Any k <= kRegTopK is served: the team's top-k is among its threads' lists.
constexpr int kRegTopK = 8;
struct RegTopK {
  float v[kRegTopK];
  int i[kRegTopK];

  __device__ RegTopK() {
#pragma unroll
    for (int a = 0; a < kRegTopK; ++a) {
      v[a] = -INFINITY;
      i[a] = INT_MAX;
    }
  }
  __device__ __forceinline__ void offer(float x, int j, int) {
    if (!(x > v[kRegTopK - 1] || (x == v[kRegTopK - 1] && j < i[kRegTopK - 1]))) return;  // NaN never enters
    v[kRegTopK - 1] = x;
    i[kRegTopK - 1] = j;
#pragma unroll
    for (int a = kRegTopK - 1; a > 0; --a) {
      if (v[a] > v[a - 1] || (v[a] == v[a - 1] && i[a] < i[a - 1])) {
        const float tv = v[a];
        v[a] = v[a - 1];
        v[a - 1] = tv;
        const int ti = i[a];
        i[a] = i[a - 1];
        i[a - 1] = ti;
      }
    }
  }
  __device__ Cand head() const { return i[0] == INT_MAX ? no_cand() : Cand{static_cast<double>(v[0]), i[0]}; }
  __device__ void pop() {
#pragma unroll
    for (int a = 0; a + 1 < kRegTopK; ++a) {
      v[a] = v[a + 1];
      i[a] = i[a + 1];
    }
    v[kRegTopK - 1] = -INFINITY;
    i[kRegTopK - 1] = INT_MAX;
  }
};

// The thread's list of a row kernel: in registers when the run's top-k fits them.
template <bool kInRegisters>
struct FastTopK;
template <>
struct FastTopK<true> : RegTopK {};
template <>
struct FastTopK<false> : LocalTopK {
  __device__ void offer(float x, int j, int k) { LocalTopK::offer(Cand{static_cast<double>(x), j}, k); }
  using LocalTopK::offer;
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

// k rounds of warp argmax over the lanes' own lists (head(), pop(): LocalTopK or
// RegTopK), into out[0..k) (lane 0 writes).
template <typename List>
__device__ void warp_merge_lists(List& mine, int k, Cand* out) {
  const int lane = threadIdx.x & 31;
  for (int r = 0; r < k; ++r) {
    const Cand h = mine.head();
    const Cand best = warp_best(h);
    if (best.i != INT_MAX && h.i == best.i) mine.pop();  // indices are distinct across lanes
    if (lane == 0) out[r] = best;
  }
}

// The team's top-k of its threads' lists into out[0..k), visible to the team on
// return (the lists are consumed). warp_lists: kRowWarps lists of scratch (W > 1 only).
template <int W, typename List>
__device__ void team_topk(List& mine, int k, Cand (*warp_lists)[kMaxTopK], Cand* out) {
  if constexpr (W == 1) {
    warp_merge_lists(mine, k, out);
    __syncwarp();
  } else {
    const int warp = threadIdx.x >> 5;
    warp_merge_lists(mine, k, warp_lists[warp]);
    __syncthreads();
    if (warp == 0)
      warp_merge(
          k, [&](int lane, int h) { return warp_lists[lane][h]; }, [&](int lane) { return lane < W ? k : 0; }, out);
    __syncthreads();
  }
}

// |topk(p) ∩ topk(p̂)| by index, p's list given by index_p(c), c < k; called by a whole
// warp (all lanes get the count).
template <typename IndexP>
__device__ int common_count(IndexP index_p, const Cand* top_phat, int k) {
  int common = 0;
  for (int base = 0; base < k; base += 32) {
    const int c = base + (threadIdx.x & 31);
    bool found = false;
    if (c < k) {
      const int i = index_p(c);
      for (int m = 0; m < k; ++m) found |= top_phat[m].i == i;
    }
    common += __popc(__ballot_sync(0xffffffffu, found));
  }
  return common;
}

// Adds a partial fp32 sum of kPartialTerms products at most to an fp64 total, as the
// CPU's fast path sums its positive terms (sim/attention_error_fast.cpp, kPartialSumKeys):
// each product a·b added by one fmaf, as the CPU's fma(a, b, partial).
constexpr int kPartialTerms = 8;
struct PartialSum {
  float part = 0.0f;
  double total = 0.0;
  int terms = 0;
  __device__ void add_product(float a, float b) {
    part = fmaf(a, b, part);
    if (++terms == kPartialTerms) {
      total += part;
      part = 0.0f;
      terms = 0;
    }
  }
  __device__ double sum() const { return total + part; }
};

// ---------------------------------------------------------------------------
// One team per row r of a row block: query head head0 + r / npos at position
// t = positions[r % npos] over keys j <= t.
// ---------------------------------------------------------------------------

// The values of an AttentionRow (sim/metrics/error_stats.h) these kernels fill:
// attention_rows_kernel kl, topk_overlap, logit_err2, logit_err_max;
// output_norms_kernel out_norm2, out_err2. A new value must be filled here too.
static_assert(sizeof(kAttentionRowValues) / sizeof(kAttentionRowValues[0]) == 6,
              "a new AttentionRow value: fill it in attention_rows_kernel or output_norms_kernel");

enum class Seen { Exact, Stored, Window };

// The shared memory of a row kernel with teams of W warps.
template <int W>
struct RowShared {
  static constexpr int kTeams = kRowWarps / W;
  double scratch[kRowWarps];
  Cand warp_lists[W == 1 ? 1 : kRowWarps][kMaxTopK];
  Cand top_a[kTeams][kMaxTopK], top_b[kTeams][kMaxTopK];
};

// This thread's team of W warps (one row each), its rank in the team and the team's
// row of the block (a row kernel returns for rows past the block's).
template <int W>
struct RowTeam {
  static_assert(W == 1 || W == kRowWarps, "a team is one warp or the whole block");
  static constexpr int kTeams = kRowWarps / W, kThreads = 32 * W;
  int team, tt, row;
  __device__ RowTeam()
      : team(threadIdx.x / kThreads), tt(threadIdx.x % kThreads), row(blockIdx.x * kTeams + threadIdx.x / kThreads) {}
};

// Where a row of a block is, and how it reads its units' versions.
struct RowPlace {
  int r = 0, i = 0;  // row in the block, position index in the block
  int64_t t = 0, n = 0, row_off = 0;
};

__device__ RowPlace row_place(int r, int npos, const int32_t* positions, int64_t ld) {
  RowPlace p;
  p.r = r;
  p.i = r % npos;
  p.t = positions[p.i];
  p.n = p.t + 1;
  p.row_off = static_cast<int64_t>(r) * ld;
  return p;
}

// ---------------------------------------------------------------------------
// The exact pass: one team per row (sim/attention_error_fast.cpp, exact_row).
// ---------------------------------------------------------------------------
template <int W, bool kRegList>
__global__ void __launch_bounds__(kRowThreads) exact_rows_kernel(ExactRowsArgs a) {
  constexpr int kTeamThreads = RowTeam<W>::kThreads;
  __shared__ RowShared<W> sh;
  const RowTeam<W> rt;
  const int team = rt.team, tt = rt.tt, r = rt.row;
  if (r >= a.rows) return;  // W == 1 only: the whole warp
  const RowPlace at = row_place(r, a.npos, a.positions, a.ld);
  const float* s = a.scores + at.row_off;

  double mx = -INFINITY;
  for (int64_t j = tt; j < at.n; j += kTeamThreads) mx = fmax(mx, static_cast<double>(s[j]));
  const float m = static_cast<float>(team_max<W>(mx, sh.scratch));
  double z = 0;
  for (int64_t j = tt; j < at.n; j += kTeamThreads) z += attn_exact_weight(s[j], m);
  const float inv = static_cast<float>(1.0 / team_sum<W>(z, sh.scratch));
  const int k = static_cast<int>(min(static_cast<int64_t>(a.topk), at.n));
  double mass = 0;
  FastTopK<kRegList> top;
  for (int64_t j = tt; j < at.n; j += kTeamThreads) {
    const float p = attn_exact_weight(s[j], m) * inv;
    mass += p;
    if (a.probs) a.probs[at.row_off + j] = p;
    top.offer(s[j], static_cast<int>(j), k);
  }
  if (a.probs)
    for (int64_t j = at.n + tt; j < a.ld; j += kTeamThreads) a.probs[at.row_off + j] = 0.0f;
  mass = team_sum<W>(mass, sh.scratch);
  team_topk<W>(top, k, sh.warp_lists, sh.top_a[team]);
  for (int c = tt; c < k; c += kTeamThreads) a.topk_out[static_cast<int64_t>(r) * a.topk + c] = sh.top_a[team][c].i;
  if (tt == 0) a.stats[r] = ExactRowStats{m, inv, mass};
}

// ---------------------------------------------------------------------------
// Every plan's rows: one team per row r of a row block, query head head0 + r / npos at
// position t = positions[r % npos] over keys j <= t.
// ---------------------------------------------------------------------------

// The values of an AttentionRow (sim/metrics/error_stats.h) these kernels fill:
// attention_rows_kernel kl, topk_overlap, logit_err2, logit_err_max;
// output_norms_kernel out_norm2, out_err2. A new value must be filled here too.
static_assert(sizeof(kAttentionRowValues) / sizeof(kAttentionRowValues[0]) == 6,
              "a new AttentionRow value: fill it in attention_rows_kernel or output_norms_kernel");

// The row's view of its units: which version of token j it sees (sim/plan.h,
// row_versions): j >= *_from is in the residual, read in the window's version when the
// unit has a window, else exact.
struct RowVersions {
  const float *ds_stored, *ds_window;
  bool exact;
  int64_t key_from, value_from;
  bool value_window;
  __device__ float ds(int64_t j) const {
    if (exact) return 0.0f;
    if (j >= key_from) return ds_window ? ds_window[j] : 0.0f;
    return ds_stored[j];
  }
  __device__ Seen value_seen(int64_t j) const {
    return exact ? Seen::Exact : j < value_from ? Seen::Stored : value_window ? Seen::Window : Seen::Exact;
  }
};

// p̂ - p and p̂ by value version into the matrices at j.
__device__ __forceinline__ void store_probs(const RowBlockArgs& a, const RowVersions& v, int64_t off, int64_t j,
                                            float dp, float phat) {
  const Seen seen = v.value_seen(j);
  a.dprobs[off + j] = dp;
  a.phat_stored[off + j] = seen == Seen::Stored ? phat : 0.0f;
  if (a.phat_win) a.phat_win[off + j] = seen == Seen::Window ? phat : 0.0f;
}

// The fp64 reference form of one row (sim/attention_error_reference.cpp), for rows
// with large logit shifts. Writes the matrices and the row's results but its identity.
template <int W>
__device__ void reference_row(const RowBlockArgs& a, const RowPlace& at, const RowVersions& v, RowShared<W>& sh,
                              int team, int tt, AttentionRow& out) {
  constexpr int kTeamThreads = 32 * W;
  const float* s = a.scores + at.row_off;
  const int64_t n = at.n;
  double mx = -INFINITY;
  for (int64_t j = tt; j < n; j += kTeamThreads) mx = fmax(mx, static_cast<double>(s[j]));
  mx = team_max<W>(mx, sh.scratch);
  double z = 0, sum_e_ds = 0, sum_e_expm1 = 0;
  for (int64_t j = tt; j < n; j += kTeamThreads) {
    const double ds = v.ds(j);
    const double e = exp(static_cast<double>(s[j]) - mx);
    z += e;
    sum_e_ds += e * ds;
    sum_e_expm1 += e * expm1(ds);
  }
  z = team_sum<W>(z, sh.scratch);
  const double mean_ds = team_sum<W>(sum_e_ds, sh.scratch) / z;
  const double A = team_sum<W>(sum_e_expm1, sh.scratch) / z;
  double zhat = 0, max_shat = -INFINITY;
  const bool large = attn_large_shift(static_cast<double>(out.logit_err_max));  // uniform over the team
  if (large) {
    for (int64_t j = tt; j < n; j += kTeamThreads)
      max_shat = fmax(max_shat, static_cast<double>(s[j]) + static_cast<double>(v.ds(j)));
    max_shat = team_max<W>(max_shat, sh.scratch);
    for (int64_t j = tt; j < n; j += kTeamThreads)
      zhat += exp(static_cast<double>(s[j]) + static_cast<double>(v.ds(j)) - max_shat);
    zhat = team_sum<W>(zhat, sh.scratch);
  }
  const int k = static_cast<int>(min(static_cast<int64_t>(a.topk), n));
  LocalTopK top_p, top_phat;
  for (int64_t j = tt; j < n; j += kTeamThreads) {
    const double ds = v.ds(j);
    const double p = exp(static_cast<double>(s[j]) - mx) / z;
    // p̂ itself, not p + (p̂ - p), as row_attention_reference computes it.
    const double phat = large ? exp(static_cast<double>(s[j]) + ds - max_shat) / zhat : p * exp(ds) / (1.0 + A);
    const double dp = large ? phat - p : attn_dprob_small_shift(p, ds, A);
    store_probs(a, v, at.row_off, j, static_cast<float>(dp), static_cast<float>(phat));
    top_p.offer(Cand{p, static_cast<int>(j)}, k);
    top_phat.offer(Cand{phat, static_cast<int>(j)}, k);
  }
  team_topk<W>(top_p, k, sh.warp_lists, sh.top_a[team]);
  team_topk<W>(top_phat, k, sh.warp_lists, sh.top_b[team]);
  if (tt < 32) {
    const Cand* listed = sh.top_a[team];
    const int common = common_count([&](int c) { return listed[c].i; }, sh.top_b[team], k);
    out.kl = static_cast<float>(fmax(0.0, large ? attn_kl_large_shift(zhat, max_shat, z, mx, mean_ds)
                                                : attn_kl_small_shift(A, mean_ds)));
    out.topk_overlap = k > 0 ? static_cast<float>(common) / static_cast<float>(k) : 1.0f;
  }
}

template <int W, bool kRegList>
__global__ void __launch_bounds__(kRowThreads) attention_rows_kernel(RowBlockArgs a) {
  constexpr int kTeamThreads = RowTeam<W>::kThreads;
  __shared__ RowShared<W> sh;
  const RowTeam<W> rt;
  const int team = rt.team, tt = rt.tt, r = rt.row;
  if (r >= a.rows) return;  // W == 1 only (W > 1: one row per block, grid = rows): the whole warp
  const RowPlace at = row_place(r, a.npos, a.positions, a.ld);
  const int64_t n = at.n;
  const float* s = a.scores + at.row_off;
  const int64_t unit = r / a.npos / a.group;  // the row's KV head within the batch
  RowVersions v;
  v.ds_stored = a.dscores + at.row_off;
  v.ds_window = a.dscores_win ? a.dscores_win + at.row_off : nullptr;
  v.exact = at.t < a.prefill;
  v.key_from = a.key_residual_from[unit * a.residual_stride + at.i];
  v.value_from = a.value_residual_from[unit * a.residual_stride + at.i];
  v.value_window = a.phat_win != nullptr;
  const ExactRowStats ex = a.exact[r];
  auto p_at = [&](int64_t j) { return attn_exact_weight(s[j], ex.max) * ex.inv; };

  // Pass 1: the logit errors, and the p-weighted mean shift.
  PartialSum err2;
  float amax = 0.0f, r0 = 0.0f;
  for (int64_t j = tt; j < n; j += kTeamThreads) {
    const float d = v.ds(j);
    amax = fmaxf(amax, fabsf(d));
    err2.add_product(d, d);     // the CPU's fma(d, d, e2)
    r0 = fmaf(p_at(j), d, r0);  // the CPU's fma(pj, d, r0)
  }
  AttentionRow out;
  out.logit_err2 = static_cast<float>(team_sum<W>(err2.sum(), sh.scratch));
  const double max_abs = team_max<W>(static_cast<double>(amax), sh.scratch);
  out.logit_err_max = static_cast<float>(max_abs);
  const double mean_shift = team_sum<W>(static_cast<double>(r0), sh.scratch) / ex.mass;
  const int k = static_cast<int>(min(static_cast<int64_t>(a.topk), n));

  if (attn_large_shift(max_abs) || !isfinite(max_abs)) {  // uniform over the team
    reference_row<W>(a, at, v, sh, team, tt, out);
  } else {
    // Pass 2: KL from the centred errors c = Δs - shift (no term cancels): with
    // R = Σ p c and B = Σ p φ(c), KL = log1p((R + B) / W) - R / W.
    const float shift = static_cast<float>(mean_shift);
    PartialSum b;
    float rs = 0.0f;
    for (int64_t j = tt; j < n; j += kTeamThreads) {
      const float c = v.ds(j) - shift, p = p_at(j);
      rs = fmaf(p, c, rs);                      // the CPU's fma(pj, c, rs)
      b.add_product(p, attn_expm1_minus_x(c));  // the CPU's fma(pj, phi, b)
    }
    const double R = team_sum<W>(static_cast<double>(rs), sh.scratch);
    const double A = (R + team_sum<W>(b.sum(), sh.scratch)) / ex.mass;
    out.kl = static_cast<float>(fmax(0.0, log1p(A) - R / ex.mass));
    // Pass 3: p̂ - p = p (expm1(c) - A) / (1 + A); the top-k of p̂ (fp32). Each add and
    // product rounded on its own (add_rn, mul_rn), as the CPU (-ffp-contract=off)
    // rounds them: nvcc or ptxas would otherwise fuse c + φ, p + dp or p·e^c·inv.
    const float af = static_cast<float>(A), inv = static_cast<float>(1.0 / (1.0 + A));
    const bool by_exp = attn_phat_by_exp(max_abs);  // p̂ from its own exp (uniform over the team)
    FastTopK<kRegList> top;
    for (int64_t j = tt; j < n; j += kTeamThreads) {
      const float c = v.ds(j) - shift, p = p_at(j);
      const float e = add_rn(c, attn_expm1_minus_x(c));
      const float dp = mul_rn(mul_rn(p, e - af), inv);
      const float phat = by_exp ? mul_rn(mul_rn(p, attn_exp_f32(c)), inv) : add_rn(p, dp);
      store_probs(a, v, at.row_off, j, dp, phat);
      top.offer(phat, static_cast<int>(j), k);
    }
    team_topk<W>(top, k, sh.warp_lists, sh.top_b[team]);
    if (tt < 32) {
      const int32_t* listed = a.exact_topk + static_cast<int64_t>(r) * a.topk;
      const int common = common_count([&](int c) { return listed[c]; }, sh.top_b[team], k);
      out.topk_overlap = k > 0 ? static_cast<float>(common) / static_cast<float>(k) : 1.0f;
    }
  }
  for (int64_t j = n + tt; j < a.ld; j += kTeamThreads) {
    a.dprobs[at.row_off + j] = 0.0f;
    a.phat_stored[at.row_off + j] = 0.0f;
    if (a.phat_win) a.phat_win[at.row_off + j] = 0.0f;
  }
  if (tt == 0) {
    AttentionRow& o = a.out_rows[static_cast<int64_t>(a.head0 + r / a.npos) * a.out_npos + a.out_pos0 + at.i];
    o.layer = a.layer;
    o.q_head = a.head0 + r / a.npos;
    o.position = static_cast<int32_t>(at.t);
    o.kl = out.kl;
    o.topk_overlap = out.topk_overlap;
    o.logit_err2 = out.logit_err2;
    o.logit_err_max = out.logit_err_max;
  }
}

// One warp per row: ||Δo||² and ||o||² in double (||o||² from a.exact_norm2 without o).
__global__ void output_norms_kernel(const float* __restrict__ o, const float* __restrict__ dout, int rows, int d,
                                    RowBlockArgs a) {
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  double on = 0, en = 0;
  for (int c = lane; c < d; c += 32) {
    const double ev = dout[static_cast<int64_t>(r) * d + c];
    en += ev * ev;
    if (o) {
      const double ov = o[static_cast<int64_t>(r) * d + c];
      on += ov * ov;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    on += __shfl_xor_sync(0xffffffffu, on, off);
    en += __shfl_xor_sync(0xffffffffu, en, off);
  }
  if (lane == 0) {
    const int64_t at = static_cast<int64_t>(a.head0 + r / a.npos) * a.out_npos + a.out_pos0 + r % a.npos;
    if (o)
      a.exact_norm2[at] = static_cast<float>(on);
    AttentionRow& out = a.out_rows[at];
    out.out_norm2 = a.exact_norm2[at];
    out.out_err2 = static_cast<float>(en);
  }
}

__global__ void gather_queries_kernel(const float* __restrict__ q, int64_t query_tokens, int d, int head0, int npos,
                                      const int32_t* __restrict__ query_rows, int64_t total, float* __restrict__ qb) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d;
    const int c = static_cast<int>(e - r * d);
    const int64_t head = head0 + r / npos;
    qb[e] = q[(head * query_tokens + query_rows[r % npos]) * d + c];
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

// A row kernel's variant by shape: a warp per row up to kWarpRowKeys keys (else a block),
// the threads' top-k lists in registers when topk <= kRegTopK (else local memory).
template <auto WarpReg, auto WarpLocal, auto BlockReg, auto BlockLocal, class Args>
void launch_rows(const Args& a, int rows, int64_t ld, int topk, cudaStream_t stream) {
  const bool warp = ld <= kWarpRowKeys, reg = topk <= kRegTopK;
  const unsigned blocks = static_cast<unsigned>(warp ? (rows + kRowWarps - 1) / kRowWarps : rows);
  if (warp && reg) WarpReg<<<blocks, kRowThreads, 0, stream>>>(a);
  else if (warp) WarpLocal<<<blocks, kRowThreads, 0, stream>>>(a);
  else if (reg) BlockReg<<<blocks, kRowThreads, 0, stream>>>(a);
  else BlockLocal<<<blocks, kRowThreads, 0, stream>>>(a);
  KVB_CUDA_CHECK_LAUNCH(row_kernel);
}

void launch_attention_rows(const RowBlockArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  launch_rows<attention_rows_kernel<1, true>, attention_rows_kernel<1, false>, attention_rows_kernel<kRowWarps, true>,
              attention_rows_kernel<kRowWarps, false>>(a, a.rows, a.ld, a.topk, stream);
}

void launch_exact_rows(const ExactRowsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  launch_rows<exact_rows_kernel<1, true>, exact_rows_kernel<1, false>, exact_rows_kernel<kRowWarps, true>,
              exact_rows_kernel<kRowWarps, false>>(a, a.rows, a.ld, a.topk, stream);
}

void launch_output_norms(const float* o, const float* dout, int rows, int d, const RowBlockArgs& a,
                         cudaStream_t stream) {
  if (rows == 0) return;
  const int warps = 8;
  output_norms_kernel<<<(rows + warps - 1) / warps, warps * 32, 0, stream>>>(o, dout, rows, d, a);
  KVB_CUDA_CHECK_LAUNCH(output_norms_kernel);
}

void launch_gather_queries(const float* q, int64_t query_tokens, int d, int head0, int heads,
                           const int32_t* query_rows, int npos, float* qb, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(heads) * npos * d;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 1 << 16);
  gather_queries_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(q, query_tokens, d, head0, npos,
                                                                           query_rows, total, qb);
  KVB_CUDA_CHECK_LAUNCH(gather_queries_kernel);
}

void launch_delta(const float* x, float* xhat, int64_t n, double* partial, cudaStream_t stream) {
  delta_kernel<<<kDeltaBlocks, 256, 0, stream>>>(x, xhat, n, partial);
  KVB_CUDA_CHECK_LAUNCH(delta_kernel);
}

}  // namespace kvb::cuda
