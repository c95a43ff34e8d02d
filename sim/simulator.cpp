#include "sim/simulator.h"

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <utility>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/attention_shift.h"

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

// One unit's reconstruction error as the attention of each query sees it.
// stored: x̂ - x of the segment version [T, d]; window: x̂ - x of the window version
// [T, d] (empty when the unit has no window).
struct UnitDelta {
  std::vector<float> stored, window;
  const RecentWindow* win = nullptr;
  // Key segments whose logits come from their format's estimator (QJL), not from a
  // decoded key: for those, Δs = estimate - exact in the stored version, on columns
  // [keep_begin, keep_end) (the segment, less what an attribution region leaves out:
  // there Δs stays the zeroed stored error's 0).
  struct Estimated {
    int64_t begin = 0, end = 0;
    std::unique_ptr<ScoreEstimator> estimator;
    int64_t keep_begin = 0, keep_end = 0;
  };
  std::vector<Estimated> estimated;
  bool has_window() const { return !window.empty(); }
};

// Which version of token j the query at t sees (Plan's time semantics).
inline Seen seen_version(const UnitDelta& u, int64_t t, int64_t j, int64_t prefill) {
  static const RecentWindow kNoWindow;
  return kvb::seen_version(u.has_window() ? *u.win : kNoWindow, prefill, t, j);
}

// Per-thread scratch for one query head.
struct HeadScratch {
  RowMat scores, dscores, dscores_win, probs, dprobs, phat_stored, phat_win, out, dout, est;
  std::vector<double> p, phat, dp;  // p, p̂ and p̂ - p of one row
  std::vector<float> ds;            // Δs of one row as the query sees the cache
  std::vector<int32_t> ia, ib;
};

// Causal attention of one row: p from the reference scores s[0..n), and p̂ from
// s + Δs. Fills p, dp = p̂ - p and p̂; returns KL(p || p̂) in nats. The formulas are
// in sim/metrics/attention_shift.h, shared with the CUDA row kernel.
double row_attention(const float* s, const float* ds, int64_t n, HeadScratch& h) {
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
  double kl;
  if (!attn_large_shift(max_abs_ds)) {
    double a = 0;
    for (int64_t j = 0; j < n; ++j) a += h.p[j] * std::expm1(static_cast<double>(ds[j]));
    for (int64_t j = 0; j < n; ++j) h.dp[j] = attn_dprob_small_shift(h.p[j], static_cast<double>(ds[j]), a);
    kl = attn_kl_small_shift(a, mean_ds);
  } else {
    double mhat = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mhat = std::max(mhat, static_cast<double>(s[j]) + ds[j]);
    double zhat = 0;
    for (int64_t j = 0; j < n; ++j) zhat += (h.phat[j] = std::exp(static_cast<double>(s[j]) + ds[j] - mhat));
    for (int64_t j = 0; j < n; ++j) h.dp[j] = h.phat[j] / zhat - h.p[j];
    kl = attn_kl_large_shift(zhat, mhat, z, mx, mean_ds);
  }
  for (int64_t j = 0; j < n; ++j) h.phat[j] = h.p[j] + h.dp[j];
  return std::max(0.0, kl);
}

// Adds the rows of query head h (positions `pos`) to stats.
//   o  = P·V
//   Δo = (P̂ - P)·V + P̂_stored·ΔV_stored + P̂_window·ΔV_window
// where P̂_stored / P̂_window keep the entries whose value the query sees in that
// version (entries of exact versions drop out).
void simulate_head(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, const UnitDelta& dk,
                   const UnitDelta& dv, const std::vector<int64_t>& pos, const SimOptions& opt, HeadScratch& s,
                   ErrorStats& stats) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const int64_t T = rec.tokens, d = rec.head_dim, prefill = plan.prefill();
  const int64_t g = rec.kv_head_of(h);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  const bool mixed_k = dk.has_window() || prefill > 0;  // Δs needs per-(t, j) selection
  const bool mixed_v = dv.has_window() || prefill > 0;
  ConstRowMap Q(L.query.slice(h), T, d);
  ConstRowMap K(L.key.slice(g), T, d);
  ConstRowMap V(L.value.slice(g), T, d);
  ConstRowMap dK(dk.stored.data(), T, d);
  ConstRowMap dV(dv.stored.data(), T, d);
  s.p.resize(static_cast<size_t>(T));
  s.phat.resize(static_cast<size_t>(T));
  s.dp.resize(static_cast<size_t>(T));
  s.ds.resize(static_cast<size_t>(T));

  for (size_t b0 = 0; b0 < pos.size(); b0 += static_cast<size_t>(opt.row_block)) {
    const size_t b1 = std::min(pos.size(), b0 + static_cast<size_t>(opt.row_block));
    const int64_t rows = static_cast<int64_t>(b1 - b0);
    const int64_t cols = pos[b1 - 1] + 1;  // keys needed by the last row of the block
    RowMat Qb(rows, d);
    for (int64_t r = 0; r < rows; ++r) Qb.row(r) = Q.row(pos[b0 + static_cast<size_t>(r)]);
    s.scores.noalias() = (Qb * K.topRows(cols).transpose()) * inv_sqrt_d;
    s.dscores.noalias() = (Qb * dK.topRows(cols).transpose()) * inv_sqrt_d;
    for (const UnitDelta::Estimated& e : dk.estimated) {  // estimated logits replace decoded-key ones
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
      s.dscores_win.noalias() = (Qb * dKw.topRows(cols).transpose()) * inv_sqrt_d;
    }
    s.probs.setZero(rows, cols);
    s.dprobs.setZero(rows, cols);
    if (mixed_v) s.phat_stored.setZero(rows, cols);
    if (dv.has_window()) s.phat_win.setZero(rows, cols);

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = pos[b0 + static_cast<size_t>(r)];
      const int64_t n = t + 1;
      const float* dsr = s.dscores.row(r).data();
      if (mixed_k) {
        for (int64_t j = 0; j < n; ++j) {
          const Seen v = seen_version(dk, t, j, prefill);
          s.ds[j] = v == Seen::Exact ? 0.0f : (v == Seen::Window ? s.dscores_win(r, j) : dsr[j]);
        }
        dsr = s.ds.data();
      }
      AttentionRow row;
      row.layer = static_cast<int32_t>(layer);
      row.q_head = static_cast<int32_t>(h);
      row.position = static_cast<int32_t>(t);
      row.kl = static_cast<float>(row_attention(s.scores.row(r).data(), dsr, n, s));
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
        for (int64_t j = 0; j < n; ++j) {
          const Seen v = seen_version(dv, t, j, prefill);
          if (v == Seen::Stored) s.phat_stored(r, j) = static_cast<float>(s.phat[j]);
          else if (v == Seen::Window) s.phat_win(r, j) = static_cast<float>(s.phat[j]);
        }
      }
      stats.rows.push_back(row);
      stats.logit_pairs += n;
    }
    s.out.noalias() = s.probs * V.topRows(cols);
    s.dout.noalias() = s.dprobs * V.topRows(cols);
    if (mixed_v) {
      s.dout.noalias() += s.phat_stored * dV.topRows(cols);
      if (dv.has_window()) {
        ConstRowMap dVw(dv.window.data(), T, d);
        s.dout.noalias() += s.phat_win * dVw.topRows(cols);
      }
    } else {
      s.dout.noalias() += (s.probs + s.dprobs) * dV.topRows(cols);
    }
    for (int64_t r = 0; r < rows; ++r) {
      AttentionRow& row = stats.rows[stats.rows.size() - static_cast<size_t>(rows - r)];
      row.out_norm2 = s.out.row(r).squaredNorm();
      row.out_err2 = s.dout.row(r).squaredNorm();
    }
  }
}

// Zeroes the reconstruction error of every row outside `region` (attribution), in
// the decoded versions and in the score estimators' columns alike.
void keep_region(const ErrorRegion& region, const UnitPlan& unit, int64_t T, int64_t d, UnitDelta& u) {
  using Part = ErrorRegion::Part;
  const bool sink_head = !unit.segments.empty() && unit.segments.front().role == SegmentRole::SinkHead;
  auto zero_rows = [&](std::vector<float>& delta, int64_t j0, int64_t j1) {
    if (!delta.empty() && j1 > j0) std::fill(delta.begin() + j0 * d, delta.begin() + j1 * d, 0.0f);
  };
  // Estimated columns follow the stored version: keep [b, e) of each, drop the empty.
  auto keep_estimated = [&](auto keep_range) {
    for (UnitDelta::Estimated& e : u.estimated) {
      const auto [kb, ke] = keep_range(e);
      e.keep_begin = std::max(e.begin, kb);
      e.keep_end = std::min(e.end, ke);
    }
    std::erase_if(u.estimated, [](const UnitDelta::Estimated& e) { return e.keep_end <= e.keep_begin; });
  };
  auto none = [](const UnitDelta::Estimated&) { return std::pair<int64_t, int64_t>{0, 0}; };
  if (region.part == Part::Tokens) {
    const int64_t b = std::clamp<int64_t>(region.begin, 0, T), e = std::clamp<int64_t>(region.end, b, T);
    for (std::vector<float>* delta : {&u.stored, &u.window}) {
      zero_rows(*delta, 0, b);
      zero_rows(*delta, e, T);
    }
    keep_estimated([&](const UnitDelta::Estimated&) { return std::pair<int64_t, int64_t>{b, e}; });
    return;
  }
  if (region.part == Part::SinkHeads) {
    if (!sink_head) {
      zero_rows(u.stored, 0, T);
      zero_rows(u.window, 0, T);
      keep_estimated(none);
    }
    return;
  }
  // Window, SinkTokens and Rest never include sink-head units.
  if (sink_head) {
    zero_rows(u.stored, 0, T);
    zero_rows(u.window, 0, T);
    keep_estimated(none);
    return;
  }
  if (region.part != Part::Window) zero_rows(u.window, 0, T);
  const SegmentRole keep = region.part == Part::SinkTokens ? SegmentRole::SinkToken : SegmentRole::Allocated;
  auto kept = [&](const Segment& s) { return region.part != Part::Window && s.role == keep; };
  for (const Segment& s : unit.segments)
    if (!kept(s)) zero_rows(u.stored, s.begin, s.end);
  keep_estimated([&](const UnitDelta::Estimated& e) {
    for (const Segment& s : unit.segments)
      if (s.begin == e.begin) return kept(s) ? std::pair<int64_t, int64_t>{e.begin, e.end} : std::pair<int64_t, int64_t>{0, 0};
    return std::pair<int64_t, int64_t>{0, 0};
  });
}

// Reconstructs one unit and returns its errors (stored and window versions), adding
// the tensor-level error of the stored version to stats.
UnitDelta unit_delta_of(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, Kind kind,
                        const SimOptions& opt, double& err2, double& norm2) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const int64_t T = rec.tokens, d = rec.head_dim, n = T * d;
  const float* x = (kind == Kind::Key ? L.key : L.value).slice(g);
  const UnitPlan& unit = plan.unit(layer, g, kind);
  const SpanInfo span = make_span_info(rec, layer, g, kind, 0, opt.seed);
  UnitDelta u;
  u.stored.resize(static_cast<size_t>(n));
  reconstruct_unit(unit, x, T, d, span, u.stored.data());
  for (int64_t i = 0; i < n; ++i) {
    u.stored[i] -= x[i];
    err2 += static_cast<double>(u.stored[i]) * u.stored[i];
    norm2 += static_cast<double>(x[i]) * x[i];
  }
  if (kind == Kind::Key)
    for (const Segment& seg : unit.segments) {
      auto est = seg.format->score_estimator(ConstMatView{x + seg.begin * d, seg.end - seg.begin, d, d},
                                             make_span_info(rec, layer, g, kind, seg.begin, opt.seed));
      if (est) u.estimated.push_back({seg.begin, seg.end, std::move(est), seg.begin, seg.end});
    }
  if (unit.window.active()) {
    u.win = &unit.window;
    u.window.resize(static_cast<size_t>(n));
    reconstruct_window(unit, x, T, d, span, u.window.data());
    for (int64_t i = 0; i < n; ++i) u.window[i] -= x[i];
  }
  if (opt.region) keep_region(*opt.region, unit, rec.tokens, rec.head_dim, u);
  return u;
}

// unit_delta_of with errors naming the unit's KV head and kind (the sweep names the
// layer), keeping the error's type.
UnitDelta unit_delta(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, Kind kind,
                     const SimOptions& opt, double& err2, double& norm2) {
  const std::string unit = "kv_head " + std::to_string(g) + " " + kind_name(kind) + ": ";
  try {
    return unit_delta_of(rec, plan, layer, g, kind, opt, err2, norm2);
  } catch (const ConfigError& e) {
    throw ConfigError(unit + e.what());
  } catch (const NonFiniteReconstruction& e) {
    throw NonFiniteReconstruction(unit + e.what());
  } catch (const Error& e) {
    throw Error(unit + e.what());
  }
}

// The query heads of KV head g: both units reconstructed once, then every head.
void simulate_group(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, const std::vector<int64_t>& pos,
                    const SimOptions& opt, HeadScratch& scratch, ErrorStats& stats) {
  const UnitDelta dk = unit_delta(rec, plan, layer, g, Kind::Key, opt, stats.k_err2, stats.k_norm2);
  const UnitDelta dv = unit_delta(rec, plan, layer, g, Kind::Value, opt, stats.v_err2, stats.v_norm2);
  // With a stop flag, each head's rows go in chunks of whole row blocks (the same
  // blocks, so the same numbers), the flag checked before each chunk.
  const size_t chunk =
      opt.stop ? static_cast<size_t>(std::max<int64_t>(1, opt.row_block * kStopCheckRowBlocks)) : pos.size();
  std::vector<int64_t> part;
  for (int64_t h = g * rec.group_size(); h < (g + 1) * rec.group_size(); ++h) {
    for (size_t c0 = 0; c0 < pos.size(); c0 += chunk) {
      if (opt.stop && opt.stop->load(std::memory_order_relaxed))
        throw SimulationStopped("stopped in layer " + std::to_string(layer) + ", query head " + std::to_string(h));
      if (chunk >= pos.size()) {
        simulate_head(rec, plan, layer, h, dk, dv, pos, opt, scratch, stats);
        break;
      }
      part.assign(pos.begin() + static_cast<std::ptrdiff_t>(c0),
                  pos.begin() + static_cast<std::ptrdiff_t>(std::min(pos.size(), c0 + chunk)));
      simulate_head(rec, plan, layer, h, dk, dv, part, opt, scratch, stats);
    }
  }
}

std::vector<int64_t> evaluated_positions(const Recording& rec, const SimOptions& opt) {
  std::vector<int64_t> pos = opt.positions;
  if (pos.empty()) {
    pos.resize(static_cast<size_t>(rec.tokens));
    std::iota(pos.begin(), pos.end(), 0);
  }
  return pos;
}

}  // namespace

SpanInfo make_span_info(const Recording& rec, int64_t layer, int64_t kv_head, Kind kind, int64_t first_token,
                        uint64_t seed) {
  SpanInfo span{layer, kv_head, kind == Kind::Key, first_token, seed};
  span.recording = rec.name.c_str();
  span.rope_applied = rec.rope.applied;
  span.rope_theta = rec.rope.theta;
  if (!rec.rope.inv_freq.empty()) span.rope_inv_freq = &rec.rope.inv_freq;
  if (!rec.positions.empty()) span.positions = rec.positions.data() + first_token;
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  if (kind == Kind::Key && !L.key_pre_rope.empty()) {
    span.key_pre_rope = L.key_pre_rope.slice(kv_head) + first_token * rec.head_dim;
    span.key_pre_rope_stride = rec.head_dim;
  }
  return span;
}

SpanInfo span_from(const SpanInfo& unit_span, int64_t offset) {
  SpanInfo span = unit_span;
  span.first_token += offset;
  if (span.key_pre_rope) span.key_pre_rope += offset * span.key_pre_rope_stride;
  if (span.positions) span.positions += offset;
  return span;
}

namespace {

// Throws NonFiniteReconstruction when `format` turned a finite value of x [n, d] into Inf or NaN
// in out (a value beyond its range: keep-fp16 beyond 65504, an fp16 scale that
// overflows): every metric of the point would be meaningless (a KL of 0 next to a
// NaN output error), so the point fails instead.
void require_finite_reconstruction(const Format& format, const float* x, const float* out, int64_t n, int64_t d,
                                   const SpanInfo& span) {
  // A branch-free count first (this runs on every reconstruction); the details only
  // when something is wrong.
  int64_t nonfinite = 0;
  for (int64_t i = 0; i < n * d; ++i) nonfinite += (std::bit_cast<uint32_t>(out[i]) & 0x7f800000u) == 0x7f800000u;
  if (nonfinite == 0) return;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n * d; ++i)
    if (!std::isfinite(out[i]) && std::isfinite(x[i]) && bad++ == 0) first = i;
  if (bad == 0) return;  // the input was not finite either (a model's own overflow)
  const int64_t row = first / d;
  // The callers name the layer, KV head and kind.
  throw NonFiniteReconstruction("format '" + format.name() + "' turned " + std::to_string(bad) + " finite " +
                                (span.is_key ? "key" : "value") + " element(s) into Inf or NaN (the first at token " +
                                std::to_string(span.first_token + row) + ", channel " + std::to_string(first % d) +
                                ": " + format_double(x[first]) + "): they exceed the format's range");
}

}  // namespace

void reconstruct_unit(const UnitPlan& unit, const float* x, int64_t T, int64_t d, SpanInfo unit_span, float* out) {
  for (const Segment& seg : unit.segments) {
    if (seg.end > T) throw Error("internal: plan segment beyond the unit's " + std::to_string(T) + " tokens");
    const int64_t n = seg.end - seg.begin;
    const SpanInfo span = span_from(unit_span, seg.begin);
    seg.format->roundtrip(ConstMatView{x + seg.begin * d, n, d, d}, MatView{out + seg.begin * d, n, d, d}, span);
    require_finite_reconstruction(*seg.format, x + seg.begin * d, out + seg.begin * d, n, d, span);
  }
}

void reconstruct_window(const UnitPlan& unit, const float* x, int64_t T, int64_t d, const SpanInfo& span,
                        float* out) {
  unit.window.format->roundtrip(ConstMatView{x, T, d, d}, MatView{out, T, d, d}, span);
  require_finite_reconstruction(*unit.window.format, x, out, T, d, span);
}

ErrorStats simulate_layer(const Recording& rec, const Plan& plan, int64_t layer, const SimOptions& opt) {
  const std::vector<int64_t> pos = evaluated_positions(rec, opt);
  ErrorStats stats;
  HeadScratch scratch;
  for (int64_t g = 0; g < rec.kv_heads; ++g) simulate_group(rec, plan, layer, g, pos, opt, scratch, stats);
  // Rows are in (q_head, position) order within the layer.
  return stats;
}

ErrorStats simulate_kv_head(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head,
                            const SimOptions& opt) {
  ErrorStats stats;
  HeadScratch scratch;
  simulate_group(rec, plan, layer, kv_head, evaluated_positions(rec, opt), opt, scratch, stats);
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
