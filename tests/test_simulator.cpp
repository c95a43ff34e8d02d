// The simulator (sim/simulator.*) against hand-computed attention errors, plans'
// memory accounting, GQA head mapping and determinism.
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
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

Recording tiny_recording(int64_t q_heads, int64_t kv_heads, int64_t T, int64_t d, uint64_t seed) {
  Recording r;
  r.name = "tiny";
  r.source = "test";
  r.q_heads = q_heads;
  r.kv_heads = kv_heads;
  r.tokens = T;
  r.head_dim = d;
  LayerTensors L;
  L.query = Tensor({q_heads, T, d});
  L.key = Tensor({kv_heads, T, d});
  L.value = Tensor({kv_heads, T, d});
  L.query.data = test::random_normal(L.query.data.size(), seed);
  L.key.data = test::random_normal(L.key.data.size(), seed + 1);
  L.value.data = test::random_normal(L.value.data.size(), seed + 2);
  r.layers = {L, L};
  r.layer_ids = {0, 1};
  r.validate();
  return r;
}

double metric(const ErrorStats& s, const char* name) { return find_metric(name)->compute(s); }

}  // namespace

TEST_CASE("an fp32 cache has zero error everywhere") {
  const Recording rec = tiny_recording(4, 2, 33, 8, 1);
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
  Recording r = tiny_recording(1, 1, 2, 1, 3);
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
  Recording r = tiny_recording(2, 1, 16, 4, 9);
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
  Recording r = tiny_recording(4, 2, 24, 8, 21);
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
  const Recording rec = tiny_recording(4, 4, 200, 16, 5);
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

TEST_CASE("plans: memory is computed from formats; segments are checked") {
  const Recording rec = tiny_recording(2, 2, 64, 32, 2);
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
}

TEST_CASE("more bits never hurt: error decreases with bit width") {
  const Recording rec = tiny_recording(4, 4, 128, 32, 17);
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
}
