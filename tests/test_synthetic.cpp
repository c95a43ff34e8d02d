// The synthetic generator (sim/synthetic.h): every control is measured on the generated
// tensors with the project's own attention and redundancy code, never taken from the
// generator's report alone.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/rope.h"
#include "sim/metrics/attention.h"
#include "sim/metrics/redundancy.h"
#include "sim/synthetic.h"
#include "test_util.h"

namespace {

// Small enough that the whole file runs in a few seconds; tokens <= calibration_queries + 1,
// so the calibration sees every query position the tests measure.
kvb::SyntheticSpec small_spec() {
  kvb::SyntheticSpec s;
  s.seed = 7;
  s.layers = 2;
  s.q_heads = 8;
  s.kv_heads = 4;
  s.head_dim = 64;
  s.tokens = 192;
  s.entropy_mean = 3.5;
  s.entropy_spread = 3.0;
  return s;
}

// Every query position but 0 (whose attention is trivially one-hot).
std::vector<int64_t> all_positions(const kvb::Recording& rec) { return kvb::spread_positions(rec.tokens, rec.tokens); }

// Causal attention row p[0..t] of (layer li, query head h) at position t.
std::vector<double> attention_row(const kvb::Recording& rec, int64_t li, int64_t h, int64_t t) {
  const kvb::LayerTensors& L = rec.layers[static_cast<size_t>(li)];
  std::vector<float> s(static_cast<size_t>(t + 1));
  std::vector<double> p(static_cast<size_t>(t + 1));
  kvb::attention_scores(L.query.slice(h), L.key.slice(rec.kv_head_of(h)), t + 1, rec.head_dim, t, t + 1, s.data());
  kvb::softmax_row(s.data(), t + 1, p.data());
  return p;
}

// Mean over query positions 1..T-1 of the attention mass on keys 0..sink_tokens-1.
double mean_sink_mass(const kvb::Recording& rec, int64_t li, int64_t h, int64_t sink_tokens) {
  double sum = 0;
  for (int64_t t = 1; t < rec.tokens; ++t) {
    const std::vector<double> p = attention_row(rec, li, h, t);
    for (int64_t j = 0; j < std::min(t + 1, sink_tokens); ++j) sum += p[static_cast<size_t>(j)];
  }
  return sum / static_cast<double>(rec.tokens - 1);
}

// Mean attention mass per key at distances [lo, hi) from the query, over every head of
// every layer and every third query position t >= t_min (t_min >= hi; compare two
// distance bands with the same t_min, as the mass per key falls with t).
double mass_per_key_at_distance(const kvb::Recording& rec, int64_t lo, int64_t hi, int64_t t_min) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t li = 0; li < rec.num_layers(); ++li)
    for (int64_t h = 0; h < rec.q_heads; ++h)
      for (int64_t t = t_min; t < rec.tokens; t += 3) {
        const std::vector<double> p = attention_row(rec, li, h, t);
        for (int64_t dist = lo; dist < hi; ++dist) sum += p[static_cast<size_t>(t - dist)];
        count += hi - lo;
      }
  return sum / static_cast<double>(count);
}

bool same_bytes(const kvb::Tensor& a, const kvb::Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

bool same_recording(const kvb::Recording& a, const kvb::Recording& b) {
  if (a.num_layers() != b.num_layers() || a.token_ids != b.token_ids) return false;
  for (int64_t l = 0; l < a.num_layers(); ++l) {
    const kvb::LayerTensors &x = a.layers[static_cast<size_t>(l)], &y = b.layers[static_cast<size_t>(l)];
    if (!same_bytes(x.query, y.query) || !same_bytes(x.key, y.key) || !same_bytes(x.value, y.value) ||
        !same_bytes(x.key_pre_rope, y.key_pre_rope))
      return false;
  }
  return true;
}

// RMS over tokens of channel c of one head's [T, d] rows.
double channel_rms(const float* rows, int64_t T, int64_t d, int64_t c) {
  double s = 0;
  for (int64_t t = 0; t < T; ++t) s += static_cast<double>(rows[t * d + c]) * rows[t * d + c];
  return std::sqrt(s / static_cast<double>(T));
}

std::string config_error_of(const kvb::SyntheticSpec& s) {
  try {
    kvb::generate_synthetic(s);
  } catch (const kvb::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("synthetic: shapes, GQA, token ids, positions, metadata") {
  kvb::SyntheticSpec s = small_spec();
  s.phase_fraction = 0.75;
  s.phase_marker = 300;
  const kvb::Recording rec = kvb::generate_synthetic(s);
  rec.validate();
  CHECK(rec.name == "synthetic");
  CHECK(rec.source.find("seed=7") != std::string::npos);
  CHECK(rec.num_layers() == 2);
  CHECK(rec.group_size() == 2);
  CHECK(rec.kv_head_of(5) == 2);
  CHECK(rec.layers[0].query.shape == std::vector<int64_t>{8, 192, 64});
  CHECK(rec.layers[0].key.shape == std::vector<int64_t>{4, 192, 64});
  CHECK(rec.layers[1].value.shape == std::vector<int64_t>{4, 192, 64});
  CHECK(rec.layers[0].key_pre_rope.empty());
  CHECK_FALSE(rec.rope.applied);
  REQUIRE(rec.phase_boundary.has_value());
  CHECK(*rec.phase_boundary == 144);
  REQUIRE(rec.token_ids.size() == 192);
  for (int64_t t = 0; t < 192; ++t) {
    const int64_t id = rec.token_ids[static_cast<size_t>(t)];
    if (t == 144) CHECK(id == 300);
    else CHECK((id >= 0 && id < 256));
    CHECK(rec.positions[static_cast<size_t>(t)] == t);
  }
  CHECK(rec.metadata.at("synthetic.rho_first") == "0.3");
  CHECK(rec.metadata.at("synthetic.phase_boundary") == "144");
  CHECK(rec.metadata.at("synthetic.warnings").empty());
  // Values ~ N(0, value_scale²).
  double s2 = 0;
  for (float v : rec.layers[1].value.data) s2 += static_cast<double>(v) * v;
  CHECK(std::sqrt(s2 / static_cast<double>(rec.layers[1].value.numel())) == doctest::Approx(1.0).epsilon(0.03));
}

TEST_CASE("synthetic: per-head entropies hit their targets and span entropy_spread") {
  const kvb::SyntheticSpec s = small_spec();
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  const std::vector<int64_t> positions = all_positions(rec);
  for (int64_t l = 0; l < s.layers; ++l) {
    std::vector<double> targets, measured;
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const double target = report.layers[static_cast<size_t>(l)].heads[static_cast<size_t>(h)].entropy_target;
      const double got = kvb::head_entropy(rec, l, h, positions).shannon;
      INFO("seed " << s.seed << " layer " << l << " head " << h << ": target " << target << " bits, measured " << got);
      CHECK(std::abs(got - target) < 0.02);
      targets.push_back(target);
      measured.push_back(got);
    }
    // Targets: entropy_mean ± spread/2 evenly over the layer's heads.
    std::sort(targets.begin(), targets.end());
    for (size_t i = 0; i < targets.size(); ++i)
      CHECK(targets[i] == doctest::Approx(2.0 + 3.0 * static_cast<double>(i) / 7.0).epsilon(1e-9));
    const auto [lo, hi] = std::minmax_element(measured.begin(), measured.end());
    CHECK(*hi - *lo == doctest::Approx(s.entropy_spread).epsilon(0.02));
    const double mean = std::accumulate(measured.begin(), measured.end(), 0.0) / static_cast<double>(measured.size());
    CHECK(mean == doctest::Approx(s.entropy_mean).epsilon(0.01));
  }
  // The order of targets over heads is seeded, not the head index.
  std::vector<double> layer0;
  for (const auto& h : report.layers[0].heads) layer0.push_back(h.entropy_target);
  CHECK_FALSE(std::is_sorted(layer0.begin(), layer0.end()));
}

TEST_CASE("synthetic: zero entropy_spread gives near-equal head entropies") {
  kvb::SyntheticSpec s = small_spec();
  s.entropy_spread = 0;
  s.entropy_mean = 4.5;
  const kvb::Recording rec = kvb::generate_synthetic(s);
  const std::vector<int64_t> positions = all_positions(rec);
  for (int64_t l = 0; l < s.layers; ++l)
    for (int64_t h = 0; h < s.q_heads; ++h) CHECK(kvb::head_entropy(rec, l, h, positions).shannon == doctest::Approx(4.5).epsilon(0.005));
}

TEST_CASE("synthetic: entropy targets hold on long contexts calibrated on a subsample") {
  // 767 query positions, 192 of them calibrated: the rest is sampling error.
  kvb::SyntheticSpec s = small_spec();
  s.layers = 1;
  s.tokens = 768;
  s.calibration_queries = 192;
  s.rope = true;
  s.recency = 1.0;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  const std::vector<int64_t> positions = all_positions(rec);
  double sq = 0;
  for (int64_t h = 0; h < s.q_heads; ++h) {
    const double target = report.layers[0].heads[static_cast<size_t>(h)].entropy_target;
    const double got = kvb::head_entropy(rec, 0, h, positions).shannon;
    INFO("head " << h << ": target " << target << ", measured " << got);
    CHECK(std::abs(got - target) < 0.3);
    sq += (got - target) * (got - target);
  }
  CHECK(std::sqrt(sq / static_cast<double>(s.q_heads)) < 0.15);
}

TEST_CASE("synthetic: odd head_dim without RoPE and multi-query attention (one KV head)") {
  kvb::SyntheticSpec s = small_spec();
  s.head_dim = 33;
  s.q_heads = 4;
  s.kv_heads = 1;
  s.recency = 1.0;
  s.sink_heads = 1;
  s.sink_mass = 0.5;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  CHECK(rec.layers[0].key.shape == std::vector<int64_t>{1, 192, 33});
  CHECK(std::count(report.channels.content.begin(), report.channels.content.end(), 32) == 1);  // unpaired
  const std::vector<int64_t> positions = all_positions(rec);
  for (int64_t h = 0; h < s.q_heads; ++h) {
    const kvb::SyntheticHeadReport& hr = report.layers[1].heads[static_cast<size_t>(h)];
    if (hr.sink) CHECK(mean_sink_mass(rec, 1, h, 1) == doctest::Approx(0.5).epsilon(0.02));
    else CHECK(kvb::head_entropy(rec, 1, h, positions).shannon == doctest::Approx(hr.entropy_target).epsilon(0.01));
  }
}

TEST_CASE("synthetic: channel layout: RoPE positional pairs use RoPE's own frequencies") {
  kvb::SyntheticSpec s = small_spec();
  s.rope = true;
  s.recency = 1.0;
  s.recency_scale = 32;
  s.sink_heads = 1;
  kvb::SyntheticReport report;
  kvb::generate_synthetic(s, &report);
  const kvb::SyntheticChannels& ch = report.channels;
  REQUIRE(ch.positional.size() == 2 * ch.positional_freq.size());
  CHECK(ch.positional_freq.size() == 4);
  for (size_t k = 0; k < ch.positional_freq.size(); ++k) {
    CHECK(ch.positional[2 * k + 1] == ch.positional[2 * k] + 32);
    CHECK(ch.positional_freq[k] == doctest::Approx(kvb::rope_inv_freq(ch.positional[2 * k], 64, s.rope_theta)));
    CHECK(ch.positional_freq[k] < 2.5 / 32);  // decays over ~recency_scale tokens
  }
  CHECK(ch.sink == std::vector<int64_t>{31, 63});  // the slowest pair
  CHECK(ch.positional.size() + ch.sink.size() + ch.content.size() == 64);
  CHECK(std::count(ch.shared.begin(), ch.shared.end(), 30) == 1);  // slow pairs carry the shared part
  CHECK(std::count(ch.shared.begin(), ch.shared.end(), 0) == 0);
}

TEST_CASE("synthetic: unreachable entropy targets are clamped with a warning, not a hang") {
  kvb::SyntheticSpec s = small_spec();
  s.layers = 1;
  s.tokens = 64;
  s.entropy_mean = 9.0;  // above log2(64): impossible
  s.entropy_spread = 0;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  CHECK_FALSE(report.warnings.empty());
  CHECK(rec.metadata.at("synthetic.warnings").find("entropy target") != std::string::npos);
  // Clamped to uniform attention over the causal prefix: mean of log2(t+1).
  double uniform = 0;
  for (int64_t t = 1; t < 64; ++t) uniform += std::log2(static_cast<double>(t + 1));
  uniform /= 63;
  CHECK(kvb::head_entropy(rec, 0, 0, all_positions(rec)).shannon == doctest::Approx(uniform).epsilon(0.01));
}

TEST_CASE("synthetic: unreachable rho is clamped with a warning naming the field") {
  // theta = 10 turns even the slowest RoPE pair by 0.1 rad per token: no direction stays
  // shared over a phase, so post-RoPE keys cannot reach rho 0.6.
  kvb::SyntheticSpec s = small_spec();
  s.layers = 1;
  s.rope = true;
  s.rope_theta = 10;
  s.rho_first = 0.6;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  REQUIRE(report.warnings.size() == 1);
  CHECK(report.warnings[0].find("rho_first") != std::string::npos);
  CHECK(kvb::key_rho(rec, 0, rec.tokens) < 0.1);
}

TEST_CASE("synthetic: sink heads put sink_mass on the sink tokens, other heads do not") {
  kvb::SyntheticSpec s = small_spec();
  s.sink_heads = 2;
  s.sink_tokens = 2;
  s.sink_mass = 0.7;
  s.recency = 1.0;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  const std::vector<int64_t> positions = all_positions(rec);
  for (int64_t l = 0; l < s.layers; ++l) {
    int sinks = 0;
    double max_sink_entropy = 0, min_plain_entropy = 1e9;
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const bool is_sink = report.layers[static_cast<size_t>(l)].heads[static_cast<size_t>(h)].sink;
      const double mass = mean_sink_mass(rec, l, h, s.sink_tokens);
      const double entropy = kvb::head_entropy(rec, l, h, positions).shannon;
      INFO("layer " << l << " head " << h << (is_sink ? " (sink)" : "") << ": sink mass " << mass);
      if (is_sink) {
        ++sinks;
        CHECK(mass == doctest::Approx(0.7).epsilon(0.02));
        max_sink_entropy = std::max(max_sink_entropy, entropy);
      } else {
        CHECK(mass < 0.1);
        min_plain_entropy = std::min(min_plain_entropy, entropy);
      }
    }
    CHECK(sinks == 2);
    CHECK(max_sink_entropy < min_plain_entropy);  // sink heads are the lowest-entropy heads
  }
}

TEST_CASE("synthetic: GPT-2-small-like: 3 strong sink heads among 144 are the lowest-entropy heads") {
  kvb::SyntheticSpec s;
  s.seed = 2024;
  s.layers = 12;
  s.q_heads = 12;
  s.kv_heads = 12;
  s.head_dim = 64;
  s.tokens = 96;
  s.entropy_mean = 3.0;
  s.entropy_spread = 3.0;
  s.sink_heads = 1;
  s.sink_layers = 3;
  s.sink_mass = 0.9;
  s.recency = 1.0;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  const std::vector<int64_t> positions = all_positions(rec);
  std::vector<std::pair<double, bool>> renyi;  // (H2, is sink head)
  for (int64_t l = 0; l < 12; ++l)
    for (int64_t h = 0; h < 12; ++h)
      renyi.emplace_back(kvb::head_entropy(rec, l, h, positions).renyi2,
                         report.layers[static_cast<size_t>(l)].heads[static_cast<size_t>(h)].sink);
  std::sort(renyi.begin(), renyi.end());
  int total_sinks = 0;
  for (const auto& [h2, sink] : renyi) total_sinks += sink;
  CHECK(total_sinks == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(renyi[static_cast<size_t>(i)].second);
    CHECK(renyi[static_cast<size_t>(i)].first < 0.4);  // "near-zero entropy (H_2 < 0.4)"
  }
  CHECK(renyi[3].first > 0.4);  // the next head is no sink
}

TEST_CASE("synthetic: recency concentrates attention on recent keys, more with larger recency") {
  for (const bool rope : {false, true}) {
    double previous_near = 0;
    for (const double recency : {0.0, 2.0, 4.0}) {
      kvb::SyntheticSpec s = small_spec();
      s.rope = rope;
      s.recency = recency;
      s.recency_scale = 16;
      s.entropy_spread = 0;
      s.entropy_mean = 4.0;
      const kvb::Recording rec = kvb::generate_synthetic(s);
      const double near = mass_per_key_at_distance(rec, 0, 8, 96);
      const double far = mass_per_key_at_distance(rec, 64, 96, 96);
      INFO("rope " << rope << " recency " << recency << ": mass per key near " << near << ", far " << far);
      if (recency > 0) {
        CHECK(near > 2.0 * far);
        CHECK(near > 1.2 * previous_near);
      } else {
        CHECK(near < 1.5 * far);  // no recency: no preference for nearby keys
      }
      previous_near = near;
    }
  }
}

TEST_CASE("synthetic: outlier channels exceed the others' RMS by outlier_scale") {
  kvb::SyntheticSpec s = small_spec();
  s.outlier_channels = 3;
  s.outlier_scale = 6.0;
  s.phase_fraction = 0.5;
  kvb::SyntheticReport report;
  const kvb::Recording rec = kvb::generate_synthetic(s, &report);
  for (int64_t l = 0; l < s.layers; ++l)
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const std::vector<int64_t>& outliers = report.layers[static_cast<size_t>(l)].outlier_channels[static_cast<size_t>(g)];
      REQUIRE(outliers.size() == 3);
      double out_rms = 0, other_rms = 0;
      for (int64_t c = 0; c < s.head_dim; ++c) {
        const double r = channel_rms(rec.layers[static_cast<size_t>(l)].key.slice(g), s.tokens, s.head_dim, c);
        (std::count(outliers.begin(), outliers.end(), c) ? out_rms : other_rms) += r;
      }
      const double ratio = (out_rms / 3) / (other_rms / static_cast<double>(s.head_dim - 3));
      INFO("layer " << l << " kv head " << g << ": RMS ratio " << ratio);
      CHECK(ratio == doctest::Approx(6.0).epsilon(0.1));
    }
  // Outliers differ between heads (chosen per KV head).
  CHECK(report.layers[0].outlier_channels[0] != report.layers[0].outlier_channels[1]);

  // With RoPE the outliers are a pre-RoPE property: compare with the other content
  // channels outside the shared slow pairs (all of equal RMS there).
  s.rope = true;
  const kvb::Recording roped = kvb::generate_synthetic(s, &report);
  const kvb::SyntheticChannels& ch = report.channels;
  for (int64_t g = 0; g < s.kv_heads; ++g) {
    const std::vector<int64_t>& outliers = report.layers[0].outlier_channels[static_cast<size_t>(g)];
    double out_rms = 0, other_rms = 0;
    int64_t n_other = 0;
    for (int64_t c : ch.content) {
      if (std::count(ch.shared.begin(), ch.shared.end(), c)) continue;
      const double r = channel_rms(roped.layers[0].key_pre_rope.slice(g), s.tokens, s.head_dim, c);
      if (std::count(outliers.begin(), outliers.end(), c)) out_rms += r;
      else other_rms += r, ++n_other;
    }
    const double ratio = (out_rms / 3) / (other_rms / static_cast<double>(n_other));
    INFO("RoPE, kv head " << g << ": pre-RoPE RMS ratio " << ratio);
    CHECK(ratio == doctest::Approx(6.0).epsilon(0.1));
  }
}

TEST_CASE("synthetic: RoPE keys are rope(key_pre_rope), and the inverse recovers them") {
  kvb::SyntheticSpec s = small_spec();
  s.rope = true;
  s.rope_theta = 500000.0;
  s.recency = 1.0;
  s.sink_heads = 1;
  const kvb::Recording rec = kvb::generate_synthetic(s);
  CHECK(rec.rope.applied);
  CHECK(rec.rope.theta == 500000.0);
  REQUIRE(rec.has_pre_rope_keys());
  for (const kvb::LayerTensors& L : rec.layers) {
    kvb::Tensor rotated = L.key_pre_rope;
    kvb::apply_rope(rotated, rec.positions, rec.rope.theta);
    CHECK(same_bytes(rotated, L.key));
    kvb::Tensor back = L.key;
    kvb::invert_rope(back, rec.positions, rec.rope.theta);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < back.data.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(back.data[i]) - L.key_pre_rope.data[i]));
      scale = std::max(scale, std::abs(static_cast<double>(L.key_pre_rope.data[i])));
    }
    CHECK(worst < 1e-5 * scale);
    CHECK_FALSE(same_bytes(L.key, L.key_pre_rope));
  }
}

TEST_CASE("synthetic: research rho per phase hits rho_first / rho_second") {
  struct Case {
    bool rope;
    double first, second, fraction;
    int64_t tokens;
  };
  for (const Case c : {Case{false, 0.46, 0.54, 0.75, 256}, Case{true, 0.46, 0.54, 0.75, 512},
                       Case{true, 0.1, 0.8, 0.5, 256}, Case{false, 0.05, 0.05, 1.0, 128}}) {
    kvb::SyntheticSpec s = small_spec();
    s.layers = 3;
    s.tokens = c.tokens;
    s.rope = c.rope;
    s.rho_first = c.first;
    s.rho_second = c.second;
    s.phase_fraction = c.fraction;
    s.recency = 2.0;
    s.sink_heads = 1;
    s.outlier_channels = 2;
    s.calibration_queries = 64;  // entropies are not under test here
    kvb::SyntheticReport report;
    const kvb::Recording rec = kvb::generate_synthetic(s, &report);
    const int64_t b = rec.phase_boundary.value_or(rec.tokens);
    const double first = kvb::key_rho(rec, 0, b);
    INFO("rope " << c.rope << ": rho " << first << " / "
                 << (b < rec.tokens ? kvb::key_rho(rec, b, rec.tokens) : first) << ", targets " << c.first << " / "
                 << c.second << "; warnings: " << rec.metadata.at("synthetic.warnings"));
    CHECK(report.warnings.empty());
    CHECK(std::abs(first - c.first) < 0.03);
    if (b < rec.tokens) CHECK(std::abs(kvb::key_rho(rec, b, rec.tokens) - c.second) < 0.03);
    for (int64_t l = 0; l < s.layers; ++l) {  // every layer, so any subset of layers too
      CHECK(std::abs(kvb::key_rho(rec, 0, b, {l}) - c.first) < 0.03);
      CHECK(report.layers[static_cast<size_t>(l)].rho_first == doctest::Approx(kvb::key_rho_layer(rec, l, 0, b)));
    }
    CHECK(std::stod(rec.metadata.at("synthetic.rho_first_measured")) == doctest::Approx(first));
  }
}

TEST_CASE("synthetic: determinism: same seed same bytes, new seed new bytes, any thread count") {
  kvb::SyntheticSpec s = small_spec();
  s.layers = 3;
  s.rope = true;
  s.recency = 1.0;
  s.sink_heads = 1;
  s.outlier_channels = 2;
  s.phase_fraction = 0.6;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const kvb::Recording one = kvb::generate_synthetic(s);
  omp_set_num_threads(2);
  const kvb::Recording two = kvb::generate_synthetic(s);
  const kvb::Recording again = kvb::generate_synthetic(s);
  omp_set_num_threads(saved);
  CHECK(same_recording(one, two));
  CHECK(same_recording(two, again));
  s.seed += 1;
  const kvb::Recording other = kvb::generate_synthetic(s);
  CHECK_FALSE(same_bytes(one.layers[0].key, other.layers[0].key));
  CHECK_FALSE(same_bytes(one.layers[0].query, other.layers[0].query));
  CHECK_FALSE(same_bytes(one.layers[0].value, other.layers[0].value));
  CHECK(one.token_ids != other.token_ids);
}

TEST_CASE("synthetic: kept queries and dropped pre-RoPE keys: what is kept is the full recording's, bit for bit") {
  kvb::SyntheticSpec s = small_spec();
  s.rope = true;
  s.recency = 1.0;
  s.sink_heads = 1;
  s.outlier_channels = 2;
  const kvb::Recording full = kvb::generate_synthetic(s);
  kvb::SyntheticKeep keep;
  keep.query_positions = {0, 5, 64, 150, 191};
  keep.key_pre_rope = false;
  kvb::SyntheticReport report_full, report_kept;
  (void)kvb::generate_synthetic(s, &report_full);
  const kvb::Recording kept = kvb::generate_synthetic(s, &report_kept, keep);
  REQUIRE(kept.num_layers() == full.num_layers());
  CHECK(kept.has_sparse_queries());
  CHECK_FALSE(kept.has_pre_rope_keys());
  CHECK(kept.summary().find("queries at 5 positions") != std::string::npos);
  CHECK(kept.metadata == full.metadata);  // the measured rho and the warnings too
  for (int64_t l = 0; l < full.num_layers(); ++l) {
    const kvb::LayerTensors &a = full.layers[static_cast<size_t>(l)], &b = kept.layers[static_cast<size_t>(l)];
    CHECK(same_bytes(a.key, b.key));
    CHECK(same_bytes(a.value, b.value));
    CHECK(b.query.shape == std::vector<int64_t>{s.q_heads, 5, s.head_dim});
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t t : keep.query_positions)
        CHECK(std::memcmp(a.query_row(h, t), b.query_row(h, t), sizeof(float) * s.head_dim) == 0);
    CHECK_THROWS_WITH_AS(b.query_row(0, 6), doctest::Contains("the query at position 6 was not kept"), kvb::Error);
    for (size_t h = 0; h < report_full.layers[static_cast<size_t>(l)].heads.size(); ++h)
      CHECK(report_full.layers[static_cast<size_t>(l)].heads[h].content_gain ==
            report_kept.layers[static_cast<size_t>(l)].heads[h].content_gain);
  }
  // Keeping a recording's queries afterwards gives the same tensors.
  kvb::Recording thinned = full;
  thinned.keep_queries_at(keep.query_positions);
  for (int64_t l = 0; l < full.num_layers(); ++l)
    CHECK(same_bytes(thinned.layers[static_cast<size_t>(l)].query, kept.layers[static_cast<size_t>(l)].query));
  // Every position asked for is the full recording.
  keep.query_positions.resize(static_cast<size_t>(s.tokens));
  std::iota(keep.query_positions.begin(), keep.query_positions.end(), int64_t{0});
  keep.key_pre_rope = true;
  CHECK(same_recording(full, kvb::generate_synthetic(s, nullptr, keep)));
  // Bad positions are refused, naming them.
  keep.query_positions = {3, 3};
  CHECK_THROWS_WITH_AS(kvb::generate_synthetic(s, nullptr, keep), doctest::Contains("kept query position 3"), kvb::Error);
  keep.query_positions = {192};
  CHECK_THROWS_WITH_AS(kvb::generate_synthetic(s, nullptr, keep), doctest::Contains("kept query position 192"),
                       kvb::Error);
}

namespace {

// Everything generate_synthetic returns, compared field by field (tensors bit for bit).
void check_same_generation(const kvb::Recording& a, const kvb::SyntheticReport& ra, const kvb::Recording& b,
                           const kvb::SyntheticReport& rb) {
  CHECK(same_recording(a, b));
  CHECK(a.metadata == b.metadata);  // measured rho and warnings included
  CHECK(a.layers[0].query_positions == b.layers[0].query_positions);
  CHECK(ra.warnings == rb.warnings);
  REQUIRE(ra.layers.size() == rb.layers.size());
  for (size_t l = 0; l < ra.layers.size(); ++l) {
    const kvb::SyntheticLayerReport &x = ra.layers[l], &y = rb.layers[l];
    CHECK(x.shared_weight_first == y.shared_weight_first);
    CHECK(x.shared_weight_second == y.shared_weight_second);
    CHECK(x.rho_first == y.rho_first);
    CHECK(x.rho_second == y.rho_second);
    CHECK(x.outlier_channels == y.outlier_channels);
    REQUIRE(x.heads.size() == y.heads.size());
    for (size_t h = 0; h < x.heads.size(); ++h) {
      CHECK(x.heads[h].content_gain == y.heads[h].content_gain);
      CHECK(x.heads[h].sink_gain == y.heads[h].sink_gain);
      CHECK(x.heads[h].entropy_calibrated == y.heads[h].entropy_calibrated);
      CHECK(x.heads[h].sink_mass_calibrated == y.heads[h].sink_mass_calibrated);
    }
  }
}

}  // namespace

TEST_CASE("synthetic: the bounded-memory generator gives the reference generator's output bit for bit") {
  // Every feature the two code paths build differently: RoPE (rows rotated one at a
  // time), recency, sinks, outliers, two phases, GQA, calibration on a subsample, kept
  // query positions (sparse rows, some of them calibration rows) and no pre-RoPE keys.
  kvb::SyntheticSpec s = small_spec();
  s.layers = 3;
  s.q_heads = 6;
  s.kv_heads = 3;  // three KV heads: a sum over them in another order would show
  s.tokens = 300;
  s.calibration_queries = 40;
  s.rope = true;
  s.recency = 1.0;
  s.sink_heads = 1;
  s.sink_layers = 2;
  s.outlier_channels = 3;
  s.phase_fraction = 0.55;
  s.rho_second = 0.6;
  s.entropy_mean = 6.0;
  s.entropy_spread = 9.0;  // up to 10.5 bits, over log2(300): clamped, warnings to compare too
  kvb::SyntheticKeep sparse;
  sparse.query_positions = {0, 1, 8, 150, 164, 165, 298, 299};
  sparse.key_pre_rope = false;
  kvb::SyntheticSpec plain = s;  // no RoPE: keys finished in place, frames coincide
  plain.rope = false;
  plain.head_dim = 33;
  plain.sink_heads = 0;
  const int saved = omp_get_max_threads();
  for (const auto& [spec, keep] : {std::pair{s, kvb::SyntheticKeep{}}, std::pair{s, sparse},
                                   std::pair{plain, sparse}}) {
    kvb::SyntheticReport reference_report;
    omp_set_num_threads(2);
    const kvb::Recording reference = kvb::generate_synthetic_reference(spec, &reference_report, keep);
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      CAPTURE(spec.rope);
      CAPTURE(keep.query_positions.size());
      omp_set_num_threads(threads);
      kvb::SyntheticReport report;
      const kvb::Recording rec = kvb::generate_synthetic(spec, &report, keep);
      check_same_generation(reference, reference_report, rec, report);
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("synthetic: spec validation names the field and the reason") {
  struct Bad {
    const char* field;
    void (*edit)(kvb::SyntheticSpec&);
  };
  const Bad cases[] = {
      {"q_heads", [](kvb::SyntheticSpec& s) { s.kv_heads = 3; }},
      {"head_dim", [](kvb::SyntheticSpec& s) { s.head_dim = 63, s.rope = true; }},
      {"head_dim", [](kvb::SyntheticSpec& s) { s.head_dim = 4, s.recency = 1, s.sink_heads = 1; }},
      {"rho_first", [](kvb::SyntheticSpec& s) { s.rho_first = 1.0; }},
      {"rho_second", [](kvb::SyntheticSpec& s) { s.phase_fraction = 0.5, s.rho_second = -0.5; }},
      {"sink_heads", [](kvb::SyntheticSpec& s) { s.sink_heads = 9; }},
      {"sink_mass", [](kvb::SyntheticSpec& s) { s.sink_heads = 1, s.sink_mass = 1.0; }},
      {"sink_tokens", [](kvb::SyntheticSpec& s) { s.sink_heads = 1, s.sink_tokens = 0; }},
      {"sink_layers", [](kvb::SyntheticSpec& s) { s.sink_heads = 1, s.sink_layers = 5; }},
      {"outlier_channels", [](kvb::SyntheticSpec& s) { s.outlier_channels = 65; }},
      {"phase_fraction", [](kvb::SyntheticSpec& s) { s.phase_fraction = 1.5; }},
      {"phase_fraction", [](kvb::SyntheticSpec& s) { s.phase_fraction = 0.999; }},
      {"entropy_spread", [](kvb::SyntheticSpec& s) { s.entropy_mean = 1, s.entropy_spread = 3; }},
      {"tokens", [](kvb::SyntheticSpec& s) { s.tokens = 1; }},
      {"layers", [](kvb::SyntheticSpec& s) { s.layers = 0; }},
      {"recency_scale", [](kvb::SyntheticSpec& s) { s.recency_scale = 0; }},
      {"key_scale", [](kvb::SyntheticSpec& s) { s.key_scale = -1; }},
      {"value_scale", [](kvb::SyntheticSpec& s) { s.value_scale = 0; }},
  };
  for (const Bad& c : cases) {
    kvb::SyntheticSpec s = small_spec();
    c.edit(s);
    const std::string msg = config_error_of(s);
    INFO("expected a ConfigError naming " << c.field << ", got: '" << msg << "'");
    CHECK(msg.find(std::string(c.field) + ":") != std::string::npos);
  }
  CHECK(config_error_of(small_spec()).empty());
}

TEST_CASE("synthetic: the memory check counts one layer when the layers stream, all of them when held") {
  // Far more layers than any machine holds (4 x 10^5 layers x 3 x 2^20 x 8 fp32 values
  // is 37 TiB), each small (96 MiB): a streamed run holds one at a time.
  kvb::SyntheticSpec s = small_spec();
  s.layers = 400000;
  s.q_heads = 1;
  s.kv_heads = 1;
  s.head_dim = 8;
  s.tokens = int64_t{1} << 20;
  CHECK_NOTHROW(kvb::validate_synthetic_spec(s));
  CHECK_NOTHROW(kvb::SyntheticLayers(s, kvb::SyntheticKeep{{s.tokens - 1}, false}));
  const std::string held = config_error_of(s);  // refused before any allocation
  CHECK(held.find("tokens: layers x") != std::string::npos);
  CHECK(held.find("stream_layers") != std::string::npos);
  // One layer too large is refused whichever way the run goes.
  s.layers = 1;
  s.kv_heads = 1 << 16;
  s.q_heads = 1 << 16;
  s.head_dim = 1 << 10;
  const std::string one = config_error_of(s);
  CHECK(one.find("tokens: one layer's") != std::string::npos);
  CHECK_THROWS_AS(kvb::validate_synthetic_spec(s), kvb::ConfigError);
}

// Its speed is measured by the benchmarks, not asserted here (no test depends on wall time).
TEST_CASE("synthetic: a 6x6x64x512 recording with every feature generates") {
  kvb::SyntheticSpec s;
  s.layers = 6;
  s.q_heads = 6;
  s.kv_heads = 6;
  s.head_dim = 64;
  s.tokens = 512;
  s.rope = true;
  s.recency = 1.0;
  s.sink_heads = 1;
  s.phase_fraction = 0.75;
  s.rho_first = 0.46;
  s.rho_second = 0.54;
  const auto start = std::chrono::steady_clock::now();
  const kvb::Recording rec = kvb::generate_synthetic(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("6x6x64x512 generated in " << seconds << " s on " << omp_get_max_threads() << " threads");
  CHECK(rec.num_layers() == 6);
  CHECK(rec.tokens == 512);
  rec.validate();
}
