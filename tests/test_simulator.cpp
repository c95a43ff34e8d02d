// The simulator (sim/simulator.*) against hand-computed attention errors, plans'
// memory accounting, GQA head mapping and determinism.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "recording_test_util.h"
#include "strategy_test_util.h"
#include "test_util.h"

using namespace kvb;

namespace {

// A test format that scales every element by a constant (x̂ = c·x) and costs 1 bit.
class ScaleFormat final : public Format {
 public:
  explicit ScaleFormat(float c) : c_(c) {}
  std::string name() const override { return "scale"; }
  uint64_t storage_bits(int64_t t, int64_t d) const override { return static_cast<uint64_t>(t * d); }
  void roundtrip(ConstMatView x, MatView out, const SpanInfo&) const override {
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) out.row(r)[c] = c_ * x.row(r)[c];
  }
  double nominal_bits() const override { return 1; }

 private:
  float c_;
};

double metric(const ErrorStats& s, const char* name) { return find_metric(name)->compute(s); }

}  // namespace

TEST_CASE("an fp32 cache has zero error everywhere") {
  const Recording rec = test::random_recording(4, 2, 33, 8, 1);
  Plan plan = UniformStrategy(make_format("keep-fp32"), make_format("keep-fp32")).build({rec, 0});
  const ErrorStats s = simulate(rec, plan, SimOptions{});
  CHECK(s.rows.size() == 2u * 4u * 33u);
  CHECK(metric(s, "attn_kl_mean") == 0.0);
  CHECK(metric(s, "attn_kl_max") == 0.0);
  CHECK(metric(s, "topk_overlap") == 1.0);
  CHECK(metric(s, "attn_out_rel_err") == 0.0);
  CHECK(metric(s, "k_rel_mse") == 0.0);
  CHECK(metric(s, "logit_rmse") == 0.0);
  CHECK(std::isinf(metric(s, "k_snr_db")));
  CHECK(plan.bpe() == 32.0);
}

TEST_CASE("attention KL, output error and logit error match a hand computation") {
  // One head, head_dim 1, two tokens: q = [1, 2], k = [0.5, 1], v = [1, 3].
  Recording r = test::random_recording(1, 1, 2, 1, 3);
  r.layers.resize(1);
  r.layer_ids = {0};
  r.layers[0].query.data = {1.0f, 2.0f};
  r.layers[0].key.data = {0.5f, 1.0f};
  r.layers[0].value.data = {1.0f, 3.0f};
  const float c = 1.5f;  // keys scaled by c, values kept
  Plan plan(1, 1, 2, 1);
  plan.assign_all(Kind::Key, std::make_shared<ScaleFormat>(c));
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  const ErrorStats s = simulate(r, plan, SimOptions{});
  REQUIRE(s.rows.size() == 2);
  // Row t=0 sees only itself: no error in p; o = v0 exactly.
  CHECK(s.rows[0].kl == 0.0f);
  CHECK(s.rows[0].out_err2 == 0.0f);
  // Row t=1: s = q1·k = [1, 2], ŝ = [1.5, 3].
  const double s0 = 2 * 0.5, s1 = 2 * 1.0, h0 = c * s0, h1 = c * s1;
  const double p1 = 1 / (1 + std::exp(s0 - s1)), p0 = 1 - p1;
  const double q1 = 1 / (1 + std::exp(h0 - h1)), q0 = 1 - q1;
  const double kl = p0 * std::log(p0 / q0) + p1 * std::log(p1 / q1);
  CHECK(s.rows[1].kl == doctest::Approx(kl).epsilon(1e-6));
  const double o = p0 * 1 + p1 * 3, ohat = q0 * 1 + q1 * 3;
  CHECK(std::sqrt(s.rows[1].out_err2 / s.rows[1].out_norm2) == doctest::Approx(std::fabs(o - ohat) / o).epsilon(1e-5));
  // Logit errors over the three causal pairs: (0,0): 1·0.5·0.5, (1,0): 2·0.5·0.5, (1,1): 2·1·0.5.
  const double e00 = 0.25, e10 = 0.5, e11 = 1.0;
  CHECK(metric(s, "logit_rmse") == doctest::Approx(std::sqrt((e00 * e00 + e10 * e10 + e11 * e11) / 3)).epsilon(1e-6));
  CHECK(metric(s, "logit_err_max") == doctest::Approx(1.0));
  CHECK(metric(s, "k_rel_mse") == doctest::Approx(0.25).epsilon(1e-6));  // (c-1)^2
  CHECK(metric(s, "attn_kl_mean") == doctest::Approx(kl / 2).epsilon(1e-6));
  CHECK(metric(s, "topk_overlap") == 1.0);
}

TEST_CASE("value error passes through attention weights: Δo = Σ p_j Δv_j") {
  Recording r = test::random_recording(2, 1, 16, 4, 9);
  Plan plan(r.num_layers(), 1, 16, 4);
  plan.assign_all(Kind::Key, make_format("keep-fp32"));
  plan.assign_all(Kind::Value, std::make_shared<ScaleFormat>(1.25f));  // ΔV = 0.25 V
  const ErrorStats s = simulate(r, plan, SimOptions{});
  for (const AttentionRow& row : s.rows) {
    CHECK(row.kl == 0.0f);
    // ô = 1.25 o, so ||Δo|| / ||o|| = 0.25 on every row.
    CHECK(std::sqrt(row.out_err2 / row.out_norm2) == doctest::Approx(0.25).epsilon(1e-5));
  }
  CHECK(metric(s, "attn_out_rel_err") == doctest::Approx(0.25).epsilon(1e-5));
  CHECK(metric(s, "v_snr_db") == doctest::Approx(-20 * std::log10(0.25)).epsilon(1e-6));
}

TEST_CASE("GQA: query heads read their group's KV head") {
  Recording r = test::random_recording(4, 2, 24, 8, 21);
  // Corrupt only KV head 1's keys: only query heads 2 and 3 may see an error.
  Plan plan(r.num_layers(), 2, 24, 8);
  plan.assign_all(Kind::Key, make_format("keep-fp32"));
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  for (int64_t l = 0; l < r.num_layers(); ++l)
    plan.unit(l, 1, Kind::Key).segments = {Segment{0, 24, std::make_shared<ScaleFormat>(0.5f)}};
  const ErrorStats s = simulate(r, plan, SimOptions{});
  double kl_low = 0, kl_high = 0;
  for (const AttentionRow& row : s.rows) (row.q_head < 2 ? kl_low : kl_high) += row.kl;
  CHECK(kl_low == 0.0);
  CHECK(kl_high > 0.0);
}

TEST_CASE("evaluated positions restrict the rows; results are deterministic") {
  const Recording rec = test::random_recording(4, 4, 200, 16, 5);
  Plan plan = UniformStrategy(make_format("int3-asym-g8"), make_format("int2-asym-g8")).build({rec, 0});
  SimOptions opt;
  const ErrorStats a = simulate(rec, plan, opt), b = simulate(rec, plan, opt);
  REQUIRE(a.rows.size() == b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    CHECK(a.rows[i].kl == b.rows[i].kl);
    CHECK(a.rows[i].out_err2 == b.rows[i].out_err2);
  }
  // Small row blocks give the same numbers as large ones up to float GEMM rounding.
  opt.row_block = 7;
  const ErrorStats c = simulate(rec, plan, opt);
  CHECK(metric(c, "attn_kl_mean") == doctest::Approx(metric(a, "attn_kl_mean")).epsilon(1e-4));
  opt.positions = {0, 5, 199};
  const ErrorStats d = simulate(rec, plan, opt);
  CHECK(d.rows.size() == 2u * 4u * 3u);
  for (const AttentionRow& row : d.rows) {
    const AttentionRow& full = a.rows[static_cast<size_t>((row.layer * 4 + row.q_head) * 200 + row.position)];
    CHECK(row.kl == doctest::Approx(full.kl).epsilon(1e-4));
  }
  CHECK(metric(a, "attn_kl_mean") > 0);
  CHECK(metric(a, "topk_overlap") < 1);
}

TEST_CASE("a stop flag: the same numbers while it is false, SimulationStopped once it is true") {
  // 3 * 4 row blocks of 16 rows and a bit more: several chunks between stop checks.
  const Recording rec = test::random_recording(4, 2, 3 * 4 * 16 + 5, 16, 9);
  Plan plan = UniformStrategy(make_format("int3-asym-g8"), make_format("int2-asym-g8")).build({rec, 0});
  SimOptions opt;
  opt.row_block = 16;
  const ErrorStats plain = simulate_layer(rec, plan, 1, opt);
  std::atomic<bool> stop{false};
  opt.stop = &stop;
  const ErrorStats checked = simulate_layer(rec, plan, 1, opt);
  REQUIRE(checked.rows.size() == plain.rows.size());
  for (size_t i = 0; i < plain.rows.size(); ++i) {  // bit for bit, in the same (q_head, position) order
    CHECK(checked.rows[i].q_head == plain.rows[i].q_head);
    CHECK(checked.rows[i].position == plain.rows[i].position);
    CHECK(checked.rows[i].kl == plain.rows[i].kl);
    CHECK(checked.rows[i].out_err2 == plain.rows[i].out_err2);
    CHECK(checked.rows[i].topk_overlap == plain.rows[i].topk_overlap);
  }
  CHECK(checked.logit_pairs == plain.logit_pairs);
  stop = true;
  CHECK_THROWS_WITH_AS(simulate_layer(rec, plan, 1, opt), doctest::Contains("stopped in layer 1, query head 0"),
                       SimulationStopped);
}

TEST_CASE("plans: memory is computed from formats; segments are checked") {
  const Recording rec = test::random_recording(2, 2, 64, 32, 2);
  Plan plan(rec.num_layers(), 2, 64, 32);
  plan.assign_all(Kind::Key, make_format("int4-asym-g32"));   // 5 bpe
  plan.assign_all(Kind::Value, make_format("int2-asym-g32"));  // 3 bpe
  CHECK(plan.check().empty());
  CHECK(plan.bpe() == 4.0);
  CHECK(plan.storage_bits() == static_cast<uint64_t>(4.0 * rec.kv_elements()));
  CHECK(plan.bytes_at(64) == 4.0 * static_cast<double>(rec.kv_elements()) / 8);
  CHECK(plan.bpe_at(32768) == 4.0);
  // Sinks: 4 fp16 tokens then int2; at a long target context they weigh less.
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t g = 0; g < 2; ++g)
      for (Kind k : {Kind::Key, Kind::Value})
        plan.unit(l, g, k).segments = {Segment{0, 4, make_format("keep-fp16")}, Segment{4, 64, make_format("int2-asym-g32")}};
  CHECK(plan.bpe() == doctest::Approx((4 * 16.0 + 60 * 3.0) / 64));
  CHECK(plan.bpe_at(4096) == doctest::Approx((4 * 16.0 + 4092 * 3.0) / 4096));
  plan.unit(1, 1, Kind::Value).segments[1].begin = 5;
  CHECK(plan.check().find("layer 1 kv_head 1 V") != std::string::npos);
  plan.unit(1, 1, Kind::Value).segments[1].begin = 4;
  plan.unit(0, 0, Kind::Key).segments = {Segment{0, 64, make_format("int4-asym-g48")}};
  CHECK(plan.check().find("does not divide head_dim") != std::string::npos);
  CHECK_THROWS_WITH_AS(simulate(rec, plan, SimOptions{}), doctest::Contains("invalid plan"), Error);
  // Keys-only formats (a QJL sketch) cannot be a window's format.
  plan.unit(0, 0, Kind::Key).segments = {Segment{0, 64, make_format("int4-asym-g32")}};
  REQUIRE(plan.check().empty());
  plan.unit(0, 0, Kind::Key).window = RecentWindow{8, make_format("qjl-m128")};
  CHECK(plan.check().find("layer 0 kv_head 0 K: window format qjl-m128 stores keys only") != std::string::npos);
  // A window format's shape is checked like a segment's.
  plan.unit(0, 0, Kind::Key).window = RecentWindow{8, make_format("int4-asym-g48")};
  CHECK(plan.check().find("layer 0 kv_head 0 K: window format int4-asym-g48: group size 48 does not divide head_dim") !=
        std::string::npos);
}

TEST_CASE("plans at a target context: only the allocated bulk stretches, sink tokens keep their count") {
  // An attention-selected sink token can be the recording's last token; at a longer
  // context it is still one fp16 token, not the whole tail.
  const FormatPtr int2 = make_format("int2-asym-g32"), fp16 = make_format("keep-fp16");
  Plan plan(1, 1, 64, 32);
  for (Kind k : {Kind::Key, Kind::Value})
    plan.unit(0, 0, k).segments = {Segment{0, 63, int2}, Segment{63, 64, fp16, SegmentRole::SinkToken}};
  REQUIRE(plan.check().empty());
  CHECK(plan.bpe() == doctest::Approx((63 * 3.0 + 16.0) / 64));
  CHECK(plan.bpe_at(32768) == doctest::Approx((32767 * 3.0 + 16.0) / 32768));
  const UnitPlan& u = plan.unit(0, 0, Kind::Key);
  CHECK(plan.segment_bits(u, 63, 64, *fp16, 32768) == 16u * 32u);
  CHECK(plan.segment_bits(u, 0, 63, *int2, 32768) == 32767u * 3u * 32u);
  // The model's cache beyond T: the new tokens take the bulk's format.
  const UnitPlan at = plan.unit_at(0, 0, Kind::Key, 100);
  REQUIRE(at.segments.size() == 3);
  CHECK(at.segments[1].begin == 63);
  CHECK(at.segments[1].end == 64);
  CHECK(at.segments[2].begin == 64);
  CHECK(at.segments[2].end == 100);
  CHECK(at.segments[2].format == int2);
  CHECK(plan.storage_bits_at(100) == 2 * (int2->storage_bits(99, 32) + fp16->storage_bits(1, 32)));
  // Below T the plan is cut by position.
  CHECK(plan.unit_at(0, 0, Kind::Key, 40).segments.size() == 1);
  CHECK(plan.storage_bits_at(40) == 2 * int2->storage_bits(40, 32));
  // A sink head (the whole unit) does stretch.
  plan.unit(0, 0, Kind::Value).segments = {Segment{0, 64, fp16, SegmentRole::SinkHead}};
  CHECK(plan.bpe_at(32768) == doctest::Approx((32767 * 3.0 + 16.0 + 32768 * 16.0) / (2 * 32768)));
}

TEST_CASE("more bits never hurt: error decreases with bit width") {
  const Recording rec = test::random_recording(4, 4, 128, 32, 17);
  double last_kl = INFINITY, last_out = INFINITY;
  for (int b = 2; b <= 8; ++b) {
    const std::string f = "int" + std::to_string(b) + "-asym-g32";
    Plan plan = UniformStrategy(make_format(f), make_format(f)).build({rec, 0});
    const ErrorStats s = simulate(rec, plan, SimOptions{});
    const double kl = metric(s, "attn_kl_mean"), out = metric(s, "attn_out_rel_err");
    CHECK(kl < last_kl);
    CHECK(out < last_out);
    last_kl = kl;
    last_out = out;
  }
}

TEST_CASE("quantiles interpolate like NumPy") {
  CHECK(quantile({1, 2, 3, 4}, 0.5) == 2.5);
  CHECK(quantile({5}, 0.99) == 5);
  CHECK(quantile({0, 10}, 0.99) == doctest::Approx(9.9));
  std::vector<double> v(101);
  std::iota(v.begin(), v.end(), 0.0);
  CHECK(quantile(v, 0.99) == doctest::Approx(99.0));
  CHECK(std::isnan(quantile({1, std::nan(""), 3}, 0.5)));  // no order with a NaN
}

namespace {

// Brute-force reference of the time semantics: for every evaluated (t, j) the
// version of key/value j the query at t sees is assembled explicitly, and attention
// is computed in double precision from scratch.
struct Reference {
  double kl = 0, out_rel = 0;
};
Reference brute_force(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, int64_t t) {
  const int64_t T = rec.tokens, d = rec.head_dim, g = rec.kv_head_of(h);
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  auto version = [&](Kind kind, bool window) {
    std::vector<float> out(static_cast<size_t>(T * d));
    const float* x = (kind == Kind::Key ? L.key : L.value).slice(g);
    const UnitPlan& u = plan.unit(layer, g, kind);
    if (window) u.window.format->roundtrip(ConstMatView{x, T, d, d}, MatView{out.data(), T, d, d}, SpanInfo{});
    else reconstruct_unit(u, x, T, d, SpanInfo{}, out.data());
    return out;
  };
  auto pick = [&](Kind kind, int64_t j, const std::vector<float>& stored, const std::vector<float>& win) {
    const UnitPlan& u = plan.unit(layer, g, kind);
    const float* x = (kind == Kind::Key ? L.key : L.value).slice(g) + j * d;
    if (t < plan.prefill()) return std::vector<double>(x, x + d);
    const std::vector<float>& src = u.window.holds(t, j, plan.prefill()) ? win : stored;
    return std::vector<double>(src.begin() + j * d, src.begin() + (j + 1) * d);
  };
  const std::vector<float> ks = version(Kind::Key, false), vs = version(Kind::Value, false);
  const bool kw = plan.unit(layer, g, Kind::Key).window.active(), vw = plan.unit(layer, g, Kind::Value).window.active();
  const std::vector<float> kwin = kw ? version(Kind::Key, true) : ks, vwin = vw ? version(Kind::Value, true) : vs;
  const float* q = L.query.slice(h) + t * d;
  std::vector<double> s(t + 1), sh(t + 1);
  for (int64_t j = 0; j <= t; ++j) {
    const float* k = L.key.slice(g) + j * d;
    const std::vector<double> kh = pick(Kind::Key, j, ks, kwin);
    for (int64_t c = 0; c < d; ++c) {
      s[j] += double(q[c]) * k[c] / std::sqrt(double(d));
      sh[j] += double(q[c]) * kh[c] / std::sqrt(double(d));
    }
  }
  auto softmax = [](std::vector<double> v) {
    const double m = *std::max_element(v.begin(), v.end());
    double z = 0;
    for (double& x : v) z += (x = std::exp(x - m));
    for (double& x : v) x /= z;
    return v;
  };
  const std::vector<double> p = softmax(s), ph = softmax(sh);
  Reference ref;
  std::vector<double> o(d), oh(d);
  for (int64_t j = 0; j <= t; ++j) {
    ref.kl += p[j] * std::log(p[j] / ph[j]);
    const float* v = L.value.slice(g) + j * d;
    const std::vector<double> vh = pick(Kind::Value, j, vs, vwin);
    for (int64_t c = 0; c < d; ++c) {
      o[c] += p[j] * v[c];
      oh[c] += ph[j] * vh[c];
    }
  }
  double e = 0, nrm = 0;
  for (int64_t c = 0; c < d; ++c) {
    e += (oh[c] - o[c]) * (oh[c] - o[c]);
    nrm += o[c] * o[c];
  }
  ref.out_rel = std::sqrt(e / nrm);
  return ref;
}

void check_against_brute_force(const Recording& rec, const Plan& plan) {
  const ErrorStats s = simulate(rec, plan, SimOptions{});
  for (const AttentionRow& row : s.rows) {
    if (row.position % 3 != 0) continue;  // a third of the rows is plenty
    const Reference ref = brute_force(rec, plan, row.layer, row.q_head, row.position);
    INFO("layer " << row.layer << " head " << row.q_head << " t " << row.position);
    CHECK(row.kl == doctest::Approx(ref.kl).epsilon(2e-3).scale(1e-7));
    CHECK(std::sqrt(row.out_err2 / row.out_norm2) == doctest::Approx(ref.out_rel).epsilon(2e-3).scale(1e-6));
  }
}

}  // namespace

TEST_CASE("recency windows are relative to each query: sliding, chunked, keys only, prefill") {
  const Recording rec = test::random_recording(4, 2, 23, 8, 41);
  check_against_brute_force(rec, test::windowed_plan(rec, RecentWindow::Mode::Sliding, false, 0, 5));
  check_against_brute_force(rec, test::windowed_plan(rec, RecentWindow::Mode::Chunked, false, 0, 5));
  check_against_brute_force(rec, test::windowed_plan(rec, RecentWindow::Mode::Sliding, true, 0, 5));
  check_against_brute_force(rec, test::windowed_plan(rec, RecentWindow::Mode::Chunked, false, 7, 5));
  // A window shrinks the error compared with no window.
  Plan plain = test::windowed_plan(rec, RecentWindow::Mode::Sliding, false, 0, 5);
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < 2; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) plain.unit(l, g, k).window = RecentWindow{};
  const Plan windowed = test::windowed_plan(rec, RecentWindow::Mode::Sliding, false, 0, 5);
  const double with = metric(simulate(rec, windowed, {}), "attn_kl_mean");
  const double without = metric(simulate(rec, plain, {}), "attn_kl_mean");
  CHECK(with < without);
  // Prefill queries see exact values: rows t < prefill have no error at all.
  const ErrorStats pre = simulate(rec, test::windowed_plan(rec, RecentWindow::Mode::Chunked, false, 7, 5), {});
  for (const AttentionRow& row : pre.rows)
    if (row.position < 7) CHECK(row.out_err2 == 0.0f);
}

TEST_CASE("window membership: sliding and chunked (flushed) residuals") {
  RecentWindow w;
  w.size = 4;
  w.format = make_format("keep-fp16");
  CHECK(w.holds(10, 10, 0));
  CHECK(w.holds(10, 7, 0));
  CHECK(!w.holds(10, 6, 0));
  w.mode = RecentWindow::Mode::Chunked;
  // KIVI / HF QuantizedCache: the query attends with the residual plus its own token,
  // then a full residual is flushed. Query t = 10 sees 8, 9, 10 in the residual.
  CHECK(w.holds(10, 8, 0));
  CHECK(!w.holds(10, 7, 0));
  // Query t = 11 still sees the full residual 8..11 (W tokens); it is flushed after.
  CHECK(w.holds(11, 11, 0));
  CHECK(w.holds(11, 8, 0));
  CHECK(!w.holds(11, 7, 0));
  // Query t = 12 starts the next residual: only its own token.
  CHECK(w.holds(12, 12, 0));
  CHECK(!w.holds(12, 11, 0));
  // Query t = 0 holds itself: (t - first) mod W + 1 tokens, 1..W.
  CHECK(w.holds(0, 0, 0));
  // With a 3-token prefill the chunks start at token 3.
  CHECK(w.holds(9, 7, 3));
  CHECK(!w.holds(9, 6, 3));
  CHECK(!w.holds(9, 2, 3));
  CHECK(w.holds(10, 7, 3));
  CHECK(w.holds(11, 11, 3));
  CHECK(!w.holds(11, 10, 3));
  // Memory counts the residual the last query (t = context - 1) attends with: a full
  // one at a multiple of W, never the empty one right after the flush.
  CHECK(w.held_at(12, 0) == 4);
  CHECK(w.held_at(13, 0) == 1);
  CHECK(w.held_at(13, 3) == 2);
  CHECK(w.held_at(3, 3) == 0);  // no token after the prefill
  CHECK(w.held_at(4, 3) == 1);
  w.mode = RecentWindow::Mode::Sliding;
  CHECK(w.held_at(12, 0) == 4);
  CHECK(w.held_at(5, 3) == 2);
}

TEST_CASE("memory the evaluated queries read: bpe at t + 1 each, fp16 in the prefill (methods.md 1)") {
  // Keys: a 16-token fp32 window over int2 (3 bpe); values int2.
  Plan plan(1, 1, 64, 32);
  plan.assign_all(Kind::Key, make_format("int2-asym-g32"));
  plan.assign_all(Kind::Value, make_format("int2-asym-g32"));
  plan.unit(0, 0, Kind::Key).window = RecentWindow{16, make_format("keep-fp32")};
  // A query of a cache of at most 16 tokens reads the window alone; later ones read it too.
  CHECK(plan.mean_bpe_read({9}) == doctest::Approx((32.0 + 3.0) / 2));
  CHECK(plan.mean_bpe_read({63}) == doctest::Approx(plan.bpe()));
  CHECK(plan.mean_bpe_read({9, 63}) == doctest::Approx(((32.0 + 3.0) / 2 + plan.bpe()) / 2));
  CHECK(plan.mean_bpe_read({31}) == doctest::Approx(plan.bpe_at(32)));
  CHECK(plan.mean_bpe_read({31}) > plan.bpe());
  // A query of the prefill attends the exact cache: fp16.
  plan.set_prefill(20);
  CHECK(plan.mean_bpe_read({19}) == 16.0);
  CHECK(plan.mean_bpe_read({19, 63}) == doctest::Approx((16.0 + plan.bpe_at(64)) / 2));
  CHECK(std::isnan(plan.mean_bpe_read({})));
  // A cache stored alike has the same memory at every length.
  Plan alike(1, 1, 64, 32);
  alike.assign_all(Kind::Key, make_format("int4-asym-g32"));
  alike.assign_all(Kind::Value, make_format("int2-asym-g32"));
  CHECK(alike.mean_bpe_read({0, 5, 40, 63}) == doctest::Approx(4.0));
}

TEST_CASE("window memory: replacement W(p - b)/T, extra copy W p/T (methods.md 1)") {
  const Recording rec = test::random_recording(2, 2, 64, 32, 2);
  Plan plan(rec.num_layers(), 2, 64, 32);
  plan.assign_all(Kind::Key, make_format("int2-asym-g32"));   // 3 bpe
  plan.assign_all(Kind::Value, make_format("int2-asym-g32"));
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t g = 0; g < 2; ++g) {
      RecentWindow& w = plan.unit(l, g, Kind::Key).window;
      w.size = 16;
      w.format = make_format("keep-fp32");
    }
  // Keys: 48 tokens at 3 bpe + 16 at 32; values 3 bpe.
  CHECK(plan.bpe() == doctest::Approx(((48 * 3.0 + 16 * 32.0) / 64 + 3.0) / 2));
  CHECK(plan.bpe_at(32768) == doctest::Approx((3.0 + 16.0 * (32 - 3) / 32768 + 3.0) / 2));
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t g = 0; g < 2; ++g) plan.unit(l, g, Kind::Key).window.extra_copy = true;
  CHECK(plan.bpe() == doctest::Approx((3.0 + 16.0 * 32 / 64 + 3.0) / 2));
  CHECK(plan.bpe_at(32768) == doctest::Approx((3.0 + 16.0 * 32 / 32768 + 3.0) / 2));
  CHECK(plan.describe().find("Kwindow:16xkeep-fp32/sliding/copy") != std::string::npos);
}

namespace {

// One layer, one head, head_dim 1, two tokens, queries 1: the scores are the keys.
Recording two_token_recording(std::vector<float> keys, std::vector<float> values) {
  Recording r = test::random_recording(1, 1, 2, 1, 3);
  r.layers.resize(1);
  r.layer_ids = {0};
  r.layers[0].query.data = {1.0f, 1.0f};
  r.layers[0].key.data = std::move(keys);
  r.layers[0].value.data = std::move(values);
  return r;
}

}  // namespace

TEST_CASE("huge logit errors on near-zero probabilities stay finite (no underflow)") {
  // s = [0, -800] (p_1 underflows to 0), ŝ = [0, 200]: p̂ puts all mass on key 1.
  const Recording r = two_token_recording({0.0f, -800.0f}, {1.0f, 3.0f});
  Plan plan(1, 1, 2, 1);
  plan.assign_all(Kind::Key, std::make_shared<ScaleFormat>(-0.25f));
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  const ErrorStats s = simulate(r, plan, SimOptions{});
  REQUIRE(s.rows.size() == 2);
  CHECK(s.rows[1].kl == doctest::Approx(200.0).epsilon(1e-6));
  CHECK(std::sqrt(s.rows[1].out_err2 / s.rows[1].out_norm2) == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(s.rows[1].topk_overlap == 1.0f);  // k = 8 > 2 keys: both sets hold both keys
}

TEST_CASE("a large negative logit error on the key holding the mass stays finite (no cancellation)") {
  // Row t = 1: s = [40, 0], p = [1 - 4e-18, 4e-18]. Key 0 is quantized to 0 (Δs_0 = -40),
  // so ŝ = [0, 0] and p̂ = [1/2, 1/2]. In the small-shift form 1 + A = Σ p e^{Δs}
  // cancels to 0 in double (NaN output error); the max-shifted form is exact.
  const Recording r = two_token_recording({40.0f, 0.0f}, {1.0f, 3.0f});
  Plan plan(1, 1, 2, 1);
  plan.unit(0, 0, Kind::Key).segments = {Segment{0, 1, std::make_shared<ScaleFormat>(0.0f)},
                                         Segment{1, 2, make_format("keep-fp32")}};
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  REQUIRE(plan.check().empty());
  const ErrorStats s = simulate(r, plan, SimOptions{});
  REQUIRE(s.rows.size() == 2);
  // o = 1, ô = (1 + 3) / 2 = 2: |Δo| = 1. KL(p || p̂) = log 2 (p is all on key 0).
  CHECK(s.rows[1].out_err2 == doctest::Approx(1.0).epsilon(1e-9));
  CHECK(s.rows[1].kl == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(s.rows[0].out_err2 == 0);  // t = 0 attends key 0 alone: p = p̂ = 1
  CHECK(std::isfinite(metric(s, "attn_out_rel_fro")));
  CHECK(std::isfinite(metric(s, "attn_out_rel_err")));
}

TEST_CASE("a format that turns finite values into Inf fails the simulation instead of giving metrics") {
  // 1e5 is beyond fp16's 65504: keep-fp16 stores it as Inf.
  const Recording r = two_token_recording({0.5f, 1.0f}, {1.0f, 1e5f});
  Plan plan(1, 1, 2, 1);
  plan.assign_all(Kind::Key, make_format("keep-fp32"));
  plan.assign_all(Kind::Value, make_format("keep-fp16"));
  std::string msg;
  try {
    (void)simulate(r, plan, SimOptions{});
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("format 'keep-fp16' turned 1 finite value element(s) into Inf or NaN (the first at token 1, "
                 "channel 0: 1e+05): they exceed the format's range") != std::string::npos);
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  CHECK(std::isfinite(metric(simulate(r, plan, SimOptions{}), "v_rel_mse")));
}
