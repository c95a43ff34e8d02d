// The plain attention-error measurement (attention_error.h): fp64 per key, the
// definitions of methods.md §4 written out. The fast path is tested against it.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/attention_error.h"
#include "sim/core/sgemm.h"
#include "sim/metrics/attention_shift.h"

namespace kvb::detail {

std::vector<RowBlock> row_blocks(const std::vector<int64_t>& pos, int64_t row_block) {
  std::vector<RowBlock> blocks;
  const size_t step = static_cast<size_t>(std::max<int64_t>(row_block, 1));
  for (size_t b0 = 0; b0 < pos.size(); b0 += step) {
    const size_t b1 = std::min(pos.size(), b0 + step);
    blocks.push_back({blocks.size(), b0, static_cast<int64_t>(b1 - b0), pos[b1 - 1] + 1});
  }
  return blocks;
}

HeadTensors::HeadTensors(const Recording& rec, int64_t layer, int64_t h)
    : T(rec.tokens),
      d(rec.head_dim),
      kv_head(rec.kv_head_of(h)),
      inv_sqrt_d(1.0f / std::sqrt(static_cast<float>(rec.head_dim))),
      Q{&rec.layers[static_cast<size_t>(layer)], h, rec.head_dim},
      K(rec.layers[static_cast<size_t>(layer)].key.slice(kv_head), T, d),
      V(rec.layers[static_cast<size_t>(layer)].value.slice(kv_head), T, d) {}

void block_queries(const QueryRows& Q, const int64_t* pos, int64_t rows, float inv_sqrt_d, RowMat& Qb, RowMat& Qs) {
  Qb.resize(rows, Q.cols());
  for (int64_t r = 0; r < rows; ++r) Qb.row(r) = Q.row(pos[r]);
  Qs = Qb * inv_sqrt_d;
}

void exact_scores(const RowMat& Qs, const ConstRowMap& K, int64_t cols, HeadScratch& s) {
  gemm_abt(Qs, K.topRows(cols), HeadScratch::blk(s.scores, Qs.rows(), cols));
}

void block_scores(const RowMat& Qb, const RowMat& Qs, const ConstRowMap& K, const UnitDelta& dk, int64_t cols,
                  int64_t T, float inv_sqrt_d, HeadScratch& s, bool need_scores) {
  const int64_t rows = Qb.rows(), d = Qb.cols();
  ConstRowMap dK(dk.stored.data(), T, d);
  if (need_scores || !dk.estimated.empty()) exact_scores(Qs, K, cols, s);
  gemm_abt(Qs, dK.topRows(cols), HeadScratch::blk(s.dscores, rows, cols));
  for (const EstimatedKeys& e : dk.estimated) {  // estimated logits replace decoded-key ones
    if (e.begin >= cols) continue;
    const int64_t n = std::min(e.end, cols) - e.begin;
    s.est.resize(rows, n);
    e.estimator->estimate(ConstMatView{Qb.data(), rows, d, d}, n, MatView{s.est.data(), rows, n, n});
    const int64_t j0 = std::max(e.keep_begin, e.begin) - e.begin, j1 = std::min(e.keep_end, e.begin + n) - e.begin;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j) s.dscores(r, e.begin + j) = s.est(r, j) * inv_sqrt_d - s.scores(r, e.begin + j);
  }
  if (dk.has_window()) {
    ConstRowMap dKw(dk.window.data(), T, d);
    gemm_abt(Qs, dKw.topRows(cols), HeadScratch::blk(s.dscores_win, rows, cols));
  }
}

float topk_overlap(const double* a, const double* b, int64_t n, int64_t k, std::vector<int32_t>& ia,
                   std::vector<int32_t>& ib) {
  k = std::min(k, n);
  if (k <= 0) return 1.0f;
  ia.resize(static_cast<size_t>(n));
  ib.resize(static_cast<size_t>(n));
  std::iota(ia.begin(), ia.end(), 0);
  std::iota(ib.begin(), ib.end(), 0);
  auto by = [](const double* v) {
    return [v](int32_t x, int32_t y) { return v[x] > v[y] || (v[x] == v[y] && x < y); };
  };
  std::partial_sort(ia.begin(), ia.begin() + k, ia.end(), by(a));
  std::partial_sort(ib.begin(), ib.begin() + k, ib.end(), by(b));
  std::sort(ia.begin(), ia.begin() + k);
  std::sort(ib.begin(), ib.begin() + k);
  return static_cast<float>(common_count(ia.data(), k, ib.data(), k)) / static_cast<float>(k);
}

int64_t common_count(const int32_t* a, int64_t na, const int32_t* b, int64_t nb) {
  int64_t common = 0;
  for (int64_t i = 0, j = 0; i < na && j < nb;) {
    if (a[i] == b[j]) {
      ++common;
      ++i;
      ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return common;
}

// The formulas are in sim/metrics/attention_shift.h, shared with the CUDA row kernel.
double row_attention_reference(const float* s, const float* ds, int64_t n, HeadScratch& h) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(s[j]));
  double z = 0;
  for (int64_t j = 0; j < n; ++j) z += (h.p[j] = std::exp(static_cast<double>(s[j]) - mx));
  for (int64_t j = 0; j < n; ++j) h.p[j] /= z;
  double max_abs_ds = 0, mean_ds = 0;
  for (int64_t j = 0; j < n; ++j) {
    max_abs_ds = std::max(max_abs_ds, std::fabs(static_cast<double>(ds[j])));
    mean_ds += h.p[j] * ds[j];
  }
  if (!attn_large_shift(max_abs_ds)) {
    double a = 0;
    for (int64_t j = 0; j < n; ++j) a += h.p[j] * std::expm1(static_cast<double>(ds[j]));
    // p̂ = p e^{Δs} / (1 + A) itself, not p + (p̂ - p), which is rounding noise where p̂ is
    // 16 orders below p (max |Δs| near kLargeLogitShift).
    for (int64_t j = 0; j < n; ++j) {
      h.dp[j] = attn_dprob_small_shift(h.p[j], static_cast<double>(ds[j]), a);
      h.phat[j] = h.p[j] * std::exp(static_cast<double>(ds[j])) / (1.0 + a);
    }
    return std::max(0.0, attn_kl_small_shift(a, mean_ds));
  }
  double mhat = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mhat = std::max(mhat, static_cast<double>(s[j]) + ds[j]);
  double zhat = 0;
  for (int64_t j = 0; j < n; ++j) zhat += (h.phat[j] = std::exp(static_cast<double>(s[j]) + ds[j] - mhat));
  // p̂ itself, not p + (p̂ - p), likewise.
  for (int64_t j = 0; j < n; ++j) {
    h.phat[j] /= zhat;
    h.dp[j] = h.phat[j] - h.p[j];
  }
  return std::max(0.0, attn_kl_large_shift(zhat, mhat, z, mx, mean_ds));
}

// Adds the rows of query head h (positions `pos`) to stats.
//   o  = P·V
//   Δo = (P̂ - P)·V + P̂_stored·ΔV_stored + P̂_window·ΔV_window
// where P̂_stored / P̂_window keep the entries whose value the query sees in that
// version (entries of exact versions drop out).
void measure_head_reference(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, const UnitDelta& dk,
                            const UnitDelta& dv, const std::vector<int64_t>& pos, const SimOptions& opt,
                            HeadScratch& s, ErrorStats& stats) {
  const HeadTensors ht(rec, layer, h);
  const int64_t T = ht.T, d = ht.d, prefill = plan.prefill();
  const float inv_sqrt_d = ht.inv_sqrt_d;
  const bool mixed_k = dk.mixed(prefill);  // Δs needs per-(t, j) selection
  const bool mixed_v = dv.mixed(prefill);
  const QueryRows& Q = ht.Q;
  const ConstRowMap &K = ht.K, &V = ht.V;
  ConstRowMap dV(dv.stored.data(), T, d);
  s.p.resize(static_cast<size_t>(T));
  s.phat.resize(static_cast<size_t>(T));
  s.dp.resize(static_cast<size_t>(T));
  s.ds.resize(static_cast<size_t>(T));

  for (const RowBlock& b : row_blocks(pos, opt.row_block)) {
    check_stop(opt, b.index, layer, h);
    const size_t b0 = b.begin;
    const int64_t rows = b.rows, cols = b.cols;
    RowMat Qb, Qs;
    block_queries(Q, pos.data() + b0, rows, inv_sqrt_d, Qb, Qs);
    s.reserve(rows, T, d);
    block_scores(Qb, Qs, K, dk, cols, T, inv_sqrt_d, s);
    auto probs = HeadScratch::blk(s.probs, rows, cols), dprobs = HeadScratch::blk(s.dprobs, rows, cols);
    auto phat_stored = HeadScratch::blk(s.phat_stored, rows, cols), phat_win = HeadScratch::blk(s.phat_win, rows, cols);
    auto out = HeadScratch::blk(s.out, rows, d), dout = HeadScratch::blk(s.dout, rows, d);
    probs.setZero();
    dprobs.setZero();
    if (mixed_v) phat_stored.setZero();
    if (dv.has_window()) phat_win.setZero();

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = pos[b0 + static_cast<size_t>(r)];
      const int64_t n = t + 1;
      const float* dsr = s.dscores.row(r).data();
      if (mixed_k) {
        const RowVersions kv = dk.versions(t, prefill);
        for (int64_t j = 0; j < n; ++j) {
          const Seen v = kv.of(j);
          s.ds[j] = v == Seen::Exact ? 0.0f : (v == Seen::Window ? s.dscores_win(r, j) : dsr[j]);
        }
        dsr = s.ds.data();
      }
      AttentionRow row;
      row.layer = static_cast<int32_t>(layer);
      row.q_head = static_cast<int32_t>(h);
      row.position = static_cast<int32_t>(t);
      row.kl = static_cast<float>(row_attention_reference(s.scores.row(r).data(), dsr, n, s));
      double err2 = 0, errmax = 0;
      for (int64_t j = 0; j < n; ++j) {
        err2 += static_cast<double>(dsr[j]) * dsr[j];
        errmax = std::max(errmax, std::fabs(static_cast<double>(dsr[j])));
      }
      row.logit_err2 = static_cast<float>(err2);
      row.logit_err_max = static_cast<float>(errmax);
      row.topk_overlap = topk_overlap(s.p.data(), s.phat.data(), n, opt.topk, s.ia, s.ib);
      for (int64_t j = 0; j < n; ++j) {
        s.probs(r, j) = static_cast<float>(s.p[j]);
        s.dprobs(r, j) = static_cast<float>(s.dp[j]);
      }
      if (mixed_v) {
        const RowVersions vv = dv.versions(t, prefill);
        for (int64_t j = 0; j < n; ++j) {
          const Seen v = vv.of(j);
          if (v == Seen::Stored) s.phat_stored(r, j) = static_cast<float>(s.phat[j]);
          else if (v == Seen::Window) s.phat_win(r, j) = static_cast<float>(s.phat[j]);
        }
      }
      stats.rows.push_back(row);
      stats.logit_pairs += n;
    }
    gemm_ab(probs, V.topRows(cols), out);
    gemm_ab(dprobs, V.topRows(cols), dout);
    if (mixed_v) {
      gemm_ab(phat_stored, dV.topRows(cols), dout, GemmOutput::Accumulate);
      if (dv.has_window()) {
        ConstRowMap dVw(dv.window.data(), T, d);
        gemm_ab(phat_win, dVw.topRows(cols), dout, GemmOutput::Accumulate);
      }
    } else {
      gemm_ab(probs + dprobs, dV.topRows(cols), dout, GemmOutput::Accumulate);
    }
    for (int64_t r = 0; r < rows; ++r) {
      AttentionRow& row = stats.rows[stats.rows.size() - static_cast<size_t>(rows - r)];
      row.out_norm2 = out.row(r).squaredNorm();
      row.out_err2 = dout.row(r).squaredNorm();
    }
  }
}

}  // namespace kvb::detail
