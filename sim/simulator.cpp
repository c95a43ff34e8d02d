#include "sim/simulator.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"

namespace kvb {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMat>;

// |topk(a) ∩ topk(b)| / k over the first n entries; ties broken by lower index.
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
  int64_t common = 0;
  for (int64_t i = 0, j = 0; i < k && j < k;) {
    if (ia[i] == ib[j]) {
      ++common;
      ++i;
      ++j;
    } else if (ia[i] < ib[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return static_cast<float>(common) / static_cast<float>(k);
}

// A key segment whose logits come from its format's estimator.
struct KeyEstimator {
  int64_t begin = 0, end = 0;
  std::unique_ptr<ScoreEstimator> estimator;
};

std::vector<KeyEstimator> key_estimators(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head,
                                         const SimOptions& opt) {
  std::vector<KeyEstimator> out;
  const float* k = rec.layers[static_cast<size_t>(layer)].key.slice(kv_head);
  const int64_t d = rec.head_dim;
  for (const Segment& seg : plan.unit(layer, kv_head, Kind::Key).segments) {
    const SpanInfo span = make_span_info(rec, layer, kv_head, Kind::Key, seg.begin, opt.seed);
    auto est = seg.format->score_estimator(ConstMatView{k + seg.begin * d, seg.end - seg.begin, d, d}, span);
    if (est) out.push_back(KeyEstimator{seg.begin, seg.end, std::move(est)});
  }
  return out;
}

// Per-thread scratch for one query head.
struct HeadScratch {
  RowMat scores, dscores, probs, dprobs, out, dout, est;
  std::vector<double> p, phat;
  std::vector<int32_t> ia, ib;
};

// Adds the rows of query head h (positions `pos`) to stats.
void simulate_head(const Recording& rec, int64_t layer, int64_t h, const float* khat_delta,
                   const std::vector<KeyEstimator>& estimators, const float* vhat, const float* vdelta,
                   const std::vector<int64_t>& pos, const SimOptions& opt, HeadScratch& s, ErrorStats& stats) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const int64_t T = rec.tokens, d = rec.head_dim;
  const int64_t g = rec.kv_head_of(h);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  ConstRowMap Q(L.query.slice(h), T, d);
  ConstRowMap K(L.key.slice(g), T, d);
  ConstRowMap V(L.value.slice(g), T, d);
  ConstRowMap dK(khat_delta, T, d);
  ConstRowMap Vhat(vhat, T, d);
  ConstRowMap dV(vdelta, T, d);
  s.p.resize(static_cast<size_t>(T));
  s.phat.resize(static_cast<size_t>(T));

  for (size_t b0 = 0; b0 < pos.size(); b0 += static_cast<size_t>(opt.row_block)) {
    const size_t b1 = std::min(pos.size(), b0 + static_cast<size_t>(opt.row_block));
    const int64_t rows = static_cast<int64_t>(b1 - b0);
    const int64_t cols = pos[b1 - 1] + 1;  // keys needed by the last row of the block
    RowMat Qb(rows, d);
    for (int64_t r = 0; r < rows; ++r) Qb.row(r) = Q.row(pos[b0 + static_cast<size_t>(r)]);
    s.scores.noalias() = (Qb * K.topRows(cols).transpose()) * inv_sqrt_d;
    s.dscores.noalias() = (Qb * dK.topRows(cols).transpose()) * inv_sqrt_d;
    for (const KeyEstimator& e : estimators) {  // estimated logits replace decoded-key ones
      if (e.begin >= cols) continue;
      const int64_t n = std::min(e.end, cols) - e.begin;
      s.est.resize(rows, n);
      e.estimator->estimate(ConstMatView{Qb.data(), rows, d, d}, n, MatView{s.est.data(), rows, n, n});
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j)
          s.dscores(r, e.begin + j) = s.est(r, j) * inv_sqrt_d - s.scores(r, e.begin + j);
    }
    s.probs.setZero(rows, cols);
    s.dprobs.setZero(rows, cols);

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = pos[b0 + static_cast<size_t>(r)];
      const int64_t n = t + 1;
      const float* sr = s.scores.row(r).data();
      const float* dsr = s.dscores.row(r).data();
      // p from the reference scores (double).
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(sr[j]));
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += (s.p[j] = std::exp(static_cast<double>(sr[j]) - mx));
      for (int64_t j = 0; j < n; ++j) s.p[j] /= z;
      // p̂_j = p_j e^{Δs_j} / Σ p e^{Δs}; KL(p||p̂) = log Σ p e^{Δs} - Σ p Δs.
      double dmx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) dmx = std::max(dmx, static_cast<double>(dsr[j]));
      double zhat = 0, mean_ds = 0, err2 = 0, errmax = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double ds = dsr[j];
        s.phat[j] = s.p[j] * std::exp(ds - dmx);
        zhat += s.phat[j];
        mean_ds += s.p[j] * ds;
        err2 += ds * ds;
        errmax = std::max(errmax, std::fabs(ds));
      }
      for (int64_t j = 0; j < n; ++j) s.phat[j] /= zhat;
      AttentionRow row;
      row.layer = static_cast<int32_t>(layer);
      row.q_head = static_cast<int32_t>(h);
      row.position = static_cast<int32_t>(t);
      row.kl = static_cast<float>(std::max(0.0, std::log(zhat) + dmx - mean_ds));
      row.logit_err2 = static_cast<float>(err2);
      row.logit_err_max = static_cast<float>(errmax);
      row.topk_overlap = topk_overlap(s.p.data(), s.phat.data(), n, opt.topk, s.ia, s.ib);
      for (int64_t j = 0; j < n; ++j) {
        s.probs(r, j) = static_cast<float>(s.p[j]);
        s.dprobs(r, j) = static_cast<float>(s.phat[j] - s.p[j]);
      }
      stats.rows.push_back(row);
      stats.logit_pairs += n;
    }
    // o = P·V and Δo = P̂·ΔV + (P̂ - P)·V, with P̂ = P + ΔP.
    s.out.noalias() = s.probs * V.topRows(cols);
    s.dout.noalias() = s.dprobs * V.topRows(cols);
    s.dout.noalias() += (s.probs + s.dprobs) * dV.topRows(cols);
    for (int64_t r = 0; r < rows; ++r) {
      AttentionRow& row = stats.rows[stats.rows.size() - static_cast<size_t>(rows - r)];
      row.out_norm2 = s.out.row(r).squaredNorm();
      row.out_err2 = s.dout.row(r).squaredNorm();
    }
  }
  (void)Vhat;
}

}  // namespace

SpanInfo make_span_info(const Recording& rec, int64_t layer, int64_t kv_head, Kind kind, int64_t first_token,
                        uint64_t seed) {
  SpanInfo span{layer, kv_head, kind == Kind::Key, first_token, seed};
  span.recording = rec.name.c_str();
  span.rope_applied = rec.rope.applied;
  span.rope_theta = rec.rope.theta;
  if (!rec.positions.empty()) span.positions = rec.positions.data() + first_token;
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  if (kind == Kind::Key && !L.key_pre_rope.empty()) {
    span.key_pre_rope = L.key_pre_rope.slice(kv_head) + first_token * rec.head_dim;
    span.key_pre_rope_stride = rec.head_dim;
  }
  return span;
}

void reconstruct_unit(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head, Kind kind,
                      const SimOptions& opt, float* out) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const Tensor& src = kind == Kind::Key ? L.key : L.value;
  const int64_t d = rec.head_dim;
  const float* x = src.slice(kv_head);
  for (const Segment& seg : plan.unit(layer, kv_head, kind).segments) {
    const int64_t n = seg.end - seg.begin;
    ConstMatView in{x + seg.begin * d, n, d, d};
    MatView o{out + seg.begin * d, n, d, d};
    seg.format->roundtrip(in, o, make_span_info(rec, layer, kv_head, kind, seg.begin, opt.seed));
  }
}

ErrorStats simulate_layer(const Recording& rec, const Plan& plan, int64_t layer, const SimOptions& opt) {
  const int64_t T = rec.tokens, d = rec.head_dim;
  std::vector<int64_t> pos = opt.positions;
  if (pos.empty()) {
    pos.resize(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), 0);
  }
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  ErrorStats stats;
  std::vector<float> khat(static_cast<size_t>(T * d)), vhat(static_cast<size_t>(T * d));
  std::vector<float> kdelta(static_cast<size_t>(T * d)), vdelta(static_cast<size_t>(T * d));
  HeadScratch scratch;
  for (int64_t g = 0; g < rec.kv_heads; ++g) {
    reconstruct_unit(rec, plan, layer, g, Kind::Key, opt, khat.data());
    reconstruct_unit(rec, plan, layer, g, Kind::Value, opt, vhat.data());
    const float* k = L.key.slice(g);
    const float* v = L.value.slice(g);
    for (int64_t i = 0; i < T * d; ++i) {
      kdelta[i] = khat[i] - k[i];
      vdelta[i] = vhat[i] - v[i];
      stats.k_err2 += static_cast<double>(kdelta[i]) * kdelta[i];
      stats.k_norm2 += static_cast<double>(k[i]) * k[i];
      stats.v_err2 += static_cast<double>(vdelta[i]) * vdelta[i];
      stats.v_norm2 += static_cast<double>(v[i]) * v[i];
    }
    const std::vector<KeyEstimator> estimators = key_estimators(rec, plan, layer, g, opt);
    for (int64_t h = g * rec.group_size(); h < (g + 1) * rec.group_size(); ++h)
      simulate_head(rec, layer, h, kdelta.data(), estimators, vhat.data(), vdelta.data(), pos, opt, scratch, stats);
  }
  // Rows in (q_head, position) order within the layer.
  return stats;
}

ErrorStats simulate(const Recording& rec, const Plan& plan, const SimOptions& opt) {
  const std::string bad = plan.check();
  if (!bad.empty()) throw Error("invalid plan: " + bad);
  ErrorStats all;
  for (int64_t l = 0; l < rec.num_layers(); ++l) all.merge(simulate_layer(rec, plan, l, opt));
  return all;
}

}  // namespace kvb
