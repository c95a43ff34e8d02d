// The fast attention-error measurement (attention_error.h): the reference's
// quantities with vectorised fp32 row arithmetic.
//
// Per row (query t, n = t + 1 causal keys, scores s, logit errors Δs):
//   exact pass:  p_j = e^{s_j - max s} / Σ, W = Σ_j p_j (fp64, ≈ 1), top-k of p by s;
//   shift:       m = Σ p_j Δs_j / W, c_j = Δs_j - m (KL and p̂ do not change when every
//                Δs_j moves by the same constant; centred, no term cancels);
//   KL:          with R = Σ p_j c_j (≈ 0) and B = Σ p_j φ(c_j), φ(x) = e^x - 1 - x ≥ 0,
//                Σ p_j e^{c_j} = W + R + B, so KL(p || p̂) = log1p((R + B) / W) - R / W:
//                B, the second-order part, is summed from positive terms;
//   p̂:          p̂_j - p_j = p_j (expm1(c_j) - A) / (1 + A), A = (R + B) / W;
//   top-k of p̂ by p̂ (fp32).
// Rows whose largest |Δs| reaches kLargeLogitShift take the reference's fp64 row
// (attention_error_reference.cpp), as the reference itself switches form there.
// The exact pass is the same for every plan: ExactAttentionCache keeps it per run.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/attention_error.h"
#include "sim/core/sgemm.h"
#include "sim/metrics/attention_shift.h"
#include "sim/metrics/row_simd.h"
#include "sim/metrics/topk.h"

namespace kvb::detail {

namespace {

using namespace kvb::simd;

// Keys per fp32 partial sum of the sums of positive terms (err2, B): 8 terms per lane
// before they are added to the fp64 total.
constexpr int64_t kPartialSumKeys = 8 * kLanes;

struct RowResult {
  double kl = 0;
  double err2 = 0;
  float err_max = 0;
  float topk_overlap = 1;
};

// Fills p̂ - p (dp) and p̂ (phat) of a row whose exact pass is `ex` (p [n], its top-k
// indices topk_p), from its logit errors ds [n]; returns the row's metrics. `scores`
// gives the row's exact scores, needed only by the large-shift form.
template <class Scores>
RowResult fast_row(const ExactRow& ex, const float* p, const int32_t* topk_p, Scores scores, const float* ds,
                   int64_t n, int64_t k, HeadScratch& h, float* dp, float* phat) {
  RowResult out;
  // The shift only needs to be near the p-mean (any constant gives the same KL and p̂):
  // summed in fp32. err2 is a reported sum of positive terms: fp32 per lane over
  // kPartialSumKeys keys at most (relative error below 7·2^-24 = 4.2e-7), then fp64.
  f32v abs_max = splat(0.0f), r0 = splat(0.0f);
  f64v err2 = f64v{};
  for (int64_t j0 = 0; j0 < n; j0 += kPartialSumKeys) {
    const int64_t j1 = std::min(n, j0 + kPartialSumKeys);
    f32v e2 = splat(0.0f);
    for (int64_t j = j0; j < j1; j += kLanes) {
      const int64_t cnt = std::min(kLanes, j1 - j);
      const f32v d = load(ds + j, cnt), pj = load(p + j, cnt);
      abs_max = vmax(abs_max, vabs(d));
      e2 = fma(d, d, e2);
      r0 = fma(pj, d, r0);
    }
    err2 += widen(e2);
  }
  out.err2 = hsum(err2);
  out.err_max = hmax(abs_max);
  // p̂'s top-k. The exact row's top-k entries hold p̂'s mostly: the least of their p̂
  // is a floor the k-th reaches, so most chunks cost one comparison from the start.
  const int64_t kk = std::max<int64_t>(std::min(k, n), 0);
  h.ib.resize(static_cast<size_t>(kk));
  // (Lowered by 2^-20 of itself, so that a last-bit difference between the floor's
  // arithmetic and the stored values never excludes an entry; NaN: no floor.)
  auto topk_floor = [&](auto phat_of) {
    if (ex.topk_count != kk) return -INFINITY;
    float f = INFINITY;
    for (int64_t i = 0; i < ex.topk_count; ++i) {
      const float v = phat_of(topk_p[i]);
      if (std::isnan(v)) return -INFINITY;
      f = std::min(f, v);
    }
    return f - std::fabs(f) * 0x1p-20f;
  };
  auto topk_overlap = [&](TopK& top) {
    if (kk == 0) return 1.0f;
    const int64_t got = top.finish();
    return static_cast<float>(common_count(topk_p, ex.topk_count, h.ib.data(), got)) / static_cast<float>(kk);
  };
  if (attn_large_shift(out.err_max) || !std::isfinite(out.err_max)) {
    // The reference's fp64 row (the large-shift form needs the scores), its top-k too:
    // p̂ can sit hundreds of orders below p, below fp32's range, where fp32 would tie
    // keys at 0 (the CUDA twin ranks the same fp64 values).
    h.p.resize(static_cast<size_t>(n));
    h.dp.resize(static_cast<size_t>(n));
    h.phat.resize(static_cast<size_t>(n));
    out.kl = row_attention_reference(scores(), ds, n, h);
    for (int64_t j = 0; j < n; ++j) {
      dp[j] = static_cast<float>(h.dp[j]);  // p̂ - p in fp64, then rounded (as the reference and the CUDA twin)
      phat[j] = static_cast<float>(h.phat[j]);
    }
    out.topk_overlap = detail::topk_overlap(h.p.data(), h.phat.data(), n, k, h.ia, h.ib);
  } else {
    const float shift = static_cast<float>(hsum(widen(r0)) / ex.mass);
    // R enters KL twice with opposite signs (its rounding cancels to first order): fp32;
    // B is KL's own second-order sum of positive terms: fp32 per lane over
    // kPartialSumKeys keys at most (relative error below 4.2e-7), then fp64.
    f32v rs = splat(0.0f);
    f64v bs = f64v{};
    h.e.resize(static_cast<size_t>(n));
    for (int64_t j0 = 0; j0 < n; j0 += kPartialSumKeys) {
      const int64_t j1 = std::min(n, j0 + kPartialSumKeys);
      f32v b = splat(0.0f);
      for (int64_t j = j0; j < j1; j += kLanes) {
        const int64_t cnt = std::min(kLanes, j1 - j);
        const f32v c = load(ds + j, cnt) - shift, pj = load(p + j, cnt);
        const f32v phi = expm1_minus_x(c);
        store(h.e.data() + j, c + phi, cnt);
        rs = fma(pj, c, rs);
        b = fma(pj, phi, b);
      }
      bs += widen(b);
    }
    const double r = hsum(widen(rs)), a = (r + hsum(bs)) / ex.mass;
    out.kl = std::max(0.0, std::log1p(a) - r / ex.mass);
    const float af = static_cast<float>(a), inv = static_cast<float>(1.0 / (1.0 + a));
    // d_j = p_j (e_j - A) / (1 + A); p̂_j = p_j + d_j, or p_j e^{c_j} / (1 + A) where p̂
    // may fall far below p (attn_phat_by_exp). The floor's values computed as the lanes
    // compute them.
    const bool by_exp = attn_phat_by_exp(out.err_max);
    TopK top(kk, h.ib.data(), h.val, topk_floor([&](int64_t j) {
               if (by_exp) return p[j] * attn_exp_f32(ds[j] - shift) * inv;
               return p[j] + p[j] * (h.e[static_cast<size_t>(j)] - af) * inv;
             }));
    for (int64_t j = 0; j < n; j += kLanes) {
      const int64_t cnt = std::min(kLanes, n - j);
      const f32v pj = load(p + j, cnt);
      const f32v d = pj * (load(h.e.data() + j, cnt) - af) * inv;
      store(dp + j, d, cnt);
      store(phat + j, by_exp ? pj * exp(load(ds + j, cnt) - shift) * inv : pj + d, cnt);
      top.scan(phat, j, cnt);
    }
    out.topk_overlap = topk_overlap(top);
  }
  return out;
}

}  // namespace

ExactRow exact_row(const float* s, int64_t n, int64_t k, float* p, int32_t* topk, std::vector<float>& val) {
  ExactRow ex;
  f32v mx = splat(-INFINITY);
  for (int64_t j = 0; j < n; j += kLanes) mx = vmax(mx, load(s + j, std::min(kLanes, n - j), -INFINITY));
  const float m = hmax(mx);
  f64v z = f64v{};
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t cnt = std::min(kLanes, n - j);
    // s - m rounds to fp32 (an error up to 2e-6 for logits 40 apart); TwoSum gives the
    // rounding error e exactly, and e^{x + e} = e^x (1 + e) to first order.
    const f32v sj = load(s + j, cnt, -INFINITY), x = sj - m, back = x - sj;
    const f32v e = (sj - (x - back)) + (-m - back);
    const f32v ex = exp(x);
    const f32v w = ex > 0.0f ? ex * (e + 1.0f) : ex;  // no correction where e^x is 0 (padding: -Inf - m)
    store(p + j, w, cnt);
    z += widen(w);
  }
  const float inv = static_cast<float>(1.0 / hsum(z));
  f64v mass = f64v{};
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t cnt = std::min(kLanes, n - j);
    const f32v pj = load(p + j, cnt) * inv;
    store(p + j, pj, cnt);
    mass += widen(pj);
  }
  ex.mass = hsum(mass);
  if (k > 0) {
    TopK top(std::min(k, n), topk, val);
    top.scan_all(s, n);
    ex.topk_count = top.finish();
  }
  return ex;
}

void exact_block(const Eigen::Ref<const RowMat>& scores, const Eigen::Ref<const RowMat>& Vtop, const int64_t* pos,
                 int64_t rows, int64_t k, HeadScratch& s, float* probs_memory, ExactBlock& out) {
  const int64_t cols = scores.cols(), d = Vtop.cols();
  Eigen::Map<RowMat> probs(probs_memory, rows, cols);
  out.probs = probs_memory;
  out.cols = cols;
  out.k = std::max<int64_t>(k, 0);
  probs.setZero();
  out.topk.assign(static_cast<size_t>(rows * out.k), 0);
  out.rows.assign(static_cast<size_t>(rows), ExactRow{});
  for (int64_t r = 0; r < rows; ++r)
    out.rows[static_cast<size_t>(r)] =
        exact_row(scores.row(r).data(), pos[r] + 1, out.k, probs.row(r).data(), out.topk.data() + r * out.k, s.val);
  auto o = HeadScratch::blk(s.out, rows, d);
  gemm_ab(probs, Vtop, o);
  for (int64_t r = 0; r < rows; ++r) out.rows[static_cast<size_t>(r)].out_norm2 = o.row(r).squaredNorm();
}

ExactHead exact_head(const Recording& rec, int64_t layer, int64_t h, const std::vector<int64_t>& pos,
                     const SimOptions& opt, HeadScratch& s) {
  const HeadTensors ht(rec, layer, h);
  const std::vector<RowBlock> blocks = row_blocks(pos, opt.row_block);
  size_t floats = 0;
  for (const RowBlock& b : blocks) floats += static_cast<size_t>(b.rows * b.cols);
  ExactHead head;
  // The head's probs in one buffer, allocated up front (a cache of many heads is GiBs
  // of fresh memory: faulted in page by page it cost more than the arithmetic).
  head.memory = PrefaultedBuffer(floats * sizeof(float));
  float* next = static_cast<float*>(head.memory.data());
  RowMat Qb, Qs;
  for (const RowBlock& b : blocks) {
    check_stop(opt, b.index, layer, h);
    s.reserve(b.rows, ht.T, ht.d);
    block_queries(ht.Q, pos.data() + b.begin, b.rows, ht.inv_sqrt_d, Qb, Qs);
    exact_scores(Qs, ht.K, b.cols, s);
    head.blocks.emplace_back();
    exact_block(HeadScratch::blk(s.scores, b.rows, b.cols), ht.V.topRows(b.cols), pos.data() + b.begin, b.rows,
                opt.topk, s, next, head.blocks.back());
    next += b.rows * b.cols;
  }
  return head;
}

void measure_head_fast(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, const UnitDelta& dk,
                       const UnitDelta& dv, const std::vector<int64_t>& pos, const SimOptions& opt, HeadScratch& s,
                       ErrorStats& stats) {
  const HeadTensors ht(rec, layer, h);
  const int64_t T = ht.T, d = ht.d, prefill = plan.prefill();
  const float inv_sqrt_d = ht.inv_sqrt_d;
  const bool mixed_k = dk.mixed(prefill);  // Δs needs per-(t, j) selection
  const bool mixed_v = dv.mixed(prefill);
  const QueryRows& Q = ht.Q;
  const ConstRowMap &K = ht.K, &V = ht.V;
  ConstRowMap dV(dv.stored.data(), T, d);
  s.ds.resize(static_cast<size_t>(T));
  const ExactHead* cached = opt.exact ? opt.exact->head(layer, h, opt) : nullptr;
  ExactHead computed;
  RowMat Qb, Qs;

  for (const RowBlock& b : row_blocks(pos, opt.row_block)) {
    check_stop(opt, b.index, layer, h);
    const size_t b0 = b.begin, block = b.index;
    const int64_t rows = b.rows, cols = b.cols;
    s.reserve(rows, T, d);
    block_queries(Q, pos.data() + b0, rows, inv_sqrt_d, Qb, Qs);
    block_scores(Qb, Qs, K, dk, cols, T, inv_sqrt_d, s, cached == nullptr);
    bool have_scores = cached == nullptr || !dk.estimated.empty();  // s.scores holds this block's
    const ExactBlock* ex = cached ? &cached->blocks[block] : nullptr;
    if (!ex) {  // the exact pass of this block, as the cache would hold it
      computed.blocks.resize(1);
      // p into the scratch's probs (reserved [row_block, T] above; the fast path has no
      // other use for it).
      exact_block(HeadScratch::blk(s.scores, rows, cols), V.topRows(cols), pos.data() + b0, rows, opt.topk, s,
                  s.probs.data(), computed.blocks[0]);
      ex = &computed.blocks[0];
    }
    auto dprobs = HeadScratch::blk(s.dprobs, rows, cols), phat_stored = HeadScratch::blk(s.phat_stored, rows, cols);
    auto phat_win = HeadScratch::blk(s.phat_win, rows, cols), dout = HeadScratch::blk(s.dout, rows, d);
    if (dv.has_window()) phat_win.setZero();

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = pos[b0 + static_cast<size_t>(r)];
      const int64_t n = t + 1;
      const float* dsr = s.dscores.row(r).data();
      if (mixed_k) {
        float* sel = s.ds.data();
        if (t < prefill) {
          std::fill(sel, sel + n, 0.0f);
        } else {  // stored up to the residual, then the window's version (or exact: no error)
          const int64_t w0 = std::min(n, dk.versions(t, prefill).residual_begin);
          std::copy(dsr, dsr + w0, sel);
          if (dk.has_window())
            std::copy(s.dscores_win.row(r).data() + w0, s.dscores_win.row(r).data() + n, sel + w0);
          else
            std::fill(sel + w0, sel + n, 0.0f);
        }
        dsr = sel;
      }
      float* phat = phat_stored.row(r).data();
      float* dp = dprobs.row(r).data();
      std::fill(dp + n, dp + cols, 0.0f);  // the GEMMs read whole block rows
      std::fill(phat + n, phat + cols, 0.0f);
      auto row_scores = [&]() -> const float* {  // the block's scores, computed when a row first needs them
        if (!have_scores) exact_scores(Qs, K, cols, s);
        have_scores = true;
        return s.scores.row(r).data();
      };
      const RowResult res =
          fast_row(ex->rows[static_cast<size_t>(r)], ex->probs_of(r), ex->topk_of(r), row_scores, dsr, n,
                   opt.topk, s, dp, phat);
      if (mixed_v) {  // p̂ goes to the version of V each entry reads: exact ones drop out
        const int64_t v0 = t < prefill ? 0 : std::min(n, dv.versions(t, prefill).residual_begin);
        if (dv.has_window() && t >= prefill) std::copy(phat + v0, phat + n, phat_win.row(r).data() + v0);
        std::fill(phat + v0, phat + n, 0.0f);
      }
      AttentionRow row;
      row.layer = static_cast<int32_t>(layer);
      row.q_head = static_cast<int32_t>(h);
      row.position = static_cast<int32_t>(t);
      row.kl = static_cast<float>(res.kl);
      row.logit_err2 = static_cast<float>(res.err2);
      row.logit_err_max = res.err_max;
      row.topk_overlap = res.topk_overlap;
      row.out_norm2 = ex->rows[static_cast<size_t>(r)].out_norm2;
      stats.rows.push_back(row);
      stats.logit_pairs += n;
    }
    gemm_ab(dprobs, V.topRows(cols), dout);
    gemm_ab(phat_stored, dV.topRows(cols), dout, GemmOutput::Accumulate);
    if (dv.has_window()) {
      ConstRowMap dVw(dv.window.data(), T, d);
      gemm_ab(phat_win, dVw.topRows(cols), dout, GemmOutput::Accumulate);
    }
    for (int64_t r = 0; r < rows; ++r)
      stats.rows[stats.rows.size() - static_cast<size_t>(rows - r)].out_err2 = dout.row(r).squaredNorm();
  }
}

}  // namespace kvb::detail
