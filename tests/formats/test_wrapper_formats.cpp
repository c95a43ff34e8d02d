// Wrapper formats: dense-and-sparse outliers and pre-RoPE key quantization, against
// plain references, plus their errors in the simulator.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/outlier_format.h"
#include "sim/core/rope.h"
#include "sim/formats/prerope_format.h"
#include "sim/formats/registry.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "test_util.h"

using namespace kvb;

namespace {

std::vector<float> run(const std::string& name, const std::vector<float>& x, int64_t rows, int64_t d,
                       const SpanInfo& span = SpanInfo{}) {
  std::vector<float> y(x.size());
  FormatPtr f = make_format(name);
  f->roundtrip(ConstMatView{x.data(), rows, d, d}, MatView{y.data(), rows, d, d}, span);
  BitWriter w;
  f->encode(ConstMatView{x.data(), rows, d, d}, span, w);
  CHECK(w.bits() == f->storage_bits(rows, d));
  return y;
}

bool identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Plain dense-and-sparse: sort each row's channels by |x| (descending, lower channel
// first on ties), keep the first k as fp16, zero them in the dense copy.
std::vector<float> ref_outliers(const std::vector<float>& x, int64_t rows, int64_t d, int64_t k,
                                const std::string& inner) {
  std::vector<float> dense = x;
  std::vector<std::vector<int64_t>> kept(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> idx(static_cast<size_t>(d));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int64_t a, int64_t b) { return std::fabs(x[r * d + a]) > std::fabs(x[r * d + b]); });
    kept[r].assign(idx.begin(), idx.begin() + k);
    for (int64_t c : kept[r]) dense[r * d + c] = 0.0f;
  }
  std::vector<float> y = run(inner, dense, rows, d);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c : kept[r]) y[r * d + c] = round_to_f16(x[r * d + c]);
  return y;
}

// Plain RoPE, one element pair at a time.
// The recording's own rotation (sim/core/rope.h, Hugging Face's fp32 arithmetic),
// applied row by row at the given positions.
void ref_rope(std::vector<float>& x, int64_t rows, int64_t d, const std::vector<int64_t>& pos, double theta) {
  apply_rope(x.data(), rows, d, pos.data(), theta);
}

}  // namespace

TEST_CASE("outliers: matches the plain reference and counts value + index bits") {
  const int64_t rows = 60, d = 128;
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 81);
  for (int64_t r = 0; r < rows; ++r) x[r * d + (r * 7) % d] *= 25.0f;
  for (int64_t c = 0; c < d; ++c) x[2 * d + c] = (c % 2 ? 3.0f : -3.0f);  // all magnitudes tied
  CHECK(identical(run("outliers1%:int4-asym-g32", x, rows, d), ref_outliers(x, rows, d, 1, "int4-asym-g32")));
  CHECK(identical(run("outliers2%:nuq3-cal32", x, rows, d), ref_outliers(x, rows, d, 3, "nuq3-cal32")));
  CHECK(identical(run("outliers0.5%:q4_0", x, rows, d), ref_outliers(x, rows, d, 1, "q4_0")));
  CHECK(identical(run("outliers10%:turbo-2", x, rows, d), ref_outliers(x, rows, d, 13, "turbo-2")));
  // round(p% of head_dim) outliers, each 16-bit value + 16-bit index.
  const auto o = std::dynamic_pointer_cast<const OutlierFormat>(make_format("outliers1%:nuq4-cal256"));
  CHECK(o->outliers_per_vector(128) == 1);
  CHECK(o->outliers_per_vector(64) == 1);
  CHECK(o->outliers_per_vector(256) == 3);
  CHECK(o->storage_bits(4096, 128) == make_format("nuq4-cal256")->storage_bits(4096, 128) + 4096u * 32);
  CHECK(make_format("outliers1%:int4-sym-g32")->bpe(4096, 128) == 4.5 + 32.0 / 128);
  // Outliers are kept exactly (fp16) and reduce the error of the dense part.
  std::vector<float> y = run("outliers1%:int2-asym-g32", x, rows, d), y0 = run("int2-asym-g32", x, rows, d);
  double e = 0, e0 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += std::pow(x[i] - y[i], 2);
    e0 += std::pow(x[i] - y0[i], 2);
  }
  CHECK(e < 0.5 * e0);
  CHECK(make_format("outliers0.50%:q8_0")->name() == "outliers0.5%:q8_0");
  CHECK_THROWS_AS(make_format("outliers1:q8_0"), ConfigError);
  CHECK_THROWS_AS(make_format("outliers100%:q8_0"), ConfigError);
  CHECK_THROWS_AS(make_format("outliers1%:nope"), ConfigError);
}

TEST_CASE("RoPE helper follows the Hugging Face rotate_half convention") {
  float x[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  rope_rotate_row(x, 4, 1.0, 10000.0);  // pair (0, 2) at angle 1, pair (1, 3) at 10000^-0.5
  CHECK(x[0] == doctest::Approx(std::cos(1.0)));
  CHECK(x[2] == doctest::Approx(std::sin(1.0)));
  float y[4] = {0.0f, 1.0f, 0.0f, 0.0f};
  rope_rotate_row(y, 4, 2.0, 10000.0);
  CHECK(y[1] == doctest::Approx(std::cos(0.02)));
  CHECK(y[3] == doctest::Approx(std::sin(0.02)));
}

namespace {

// One layer, one KV head; keys post-RoPE, with pre-RoPE keys if asked.
Recording rope_recording(int64_t T, int64_t d, bool with_pre_rope) {
  Recording rec;
  rec.name = "rope-rec";
  rec.source = "test";
  rec.q_heads = 1;
  rec.kv_heads = 1;
  rec.head_dim = d;
  rec.tokens = T;
  rec.layer_ids = {0};
  rec.rope.applied = true;
  rec.rope.theta = 500000.0;
  rec.positions.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rec.positions[t] = 3 + 2 * t;  // not 0..T-1: positions must be used
  LayerTensors L;
  L.query = Tensor({1, T, d});
  L.query.data = kvb::test::random_normal(static_cast<size_t>(T * d), 91, 0.3f);
  L.key_pre_rope = Tensor({1, T, d});
  L.key_pre_rope.data = kvb::test::random_normal(static_cast<size_t>(T * d), 92);
  for (int64_t t = 0; t < T; ++t) L.key_pre_rope.data[t * d + 1] += 4.0f;  // a per-channel structure
  L.key = L.key_pre_rope;
  ref_rope(L.key.data, T, d, rec.positions, rec.rope.theta);
  L.value = Tensor({1, T, d});
  L.value.data = kvb::test::random_normal(static_cast<size_t>(T * d), 93);
  if (!with_pre_rope) L.key_pre_rope = Tensor();
  rec.layers.push_back(std::move(L));
  return rec;
}

}  // namespace

TEST_CASE("prerope: quantizes pre-RoPE keys and re-applies RoPE at the recording's positions") {
  const int64_t T = 48, d = 64;
  const Recording rec = rope_recording(T, d, true);
  const int64_t first = 8, n = T - first;
  const SpanInfo span = span_from(unit_span(rec, 0, 0, Kind::Key, 0), first);
  const float* post = rec.layers[0].key.ptr() + first * d;
  const std::vector<float> post_keys(post, post + n * d);
  const std::vector<int64_t> pos(rec.positions.begin() + first, rec.positions.end());
  for (const std::string inner : {"int4-asym-ch16", "nuq3-cal16", "q4_0"}) {
    INFO(inner);
    // Reference: the inner format on the pre-RoPE keys, then plain RoPE.
    const float* pre = rec.layers[0].key_pre_rope.ptr() + first * d;
    std::vector<float> expect = run(inner, std::vector<float>(pre, pre + n * d), n, d);
    ref_rope(expect, n, d, pos, rec.rope.theta);
    CHECK(identical(run("prerope:" + inner, post_keys, n, d, span), expect));
    CHECK(make_format("prerope:" + inner)->storage_bits(n, d) == make_format(inner)->storage_bits(n, d));
  }
  // Lossless inner format: the post-RoPE keys come back exactly.
  CHECK(identical(run("prerope:keep-fp32", post_keys, n, d, span), post_keys));
  // Values are stored with the inner format unchanged.
  const SpanInfo vspan = unit_span(rec, 0, 0, Kind::Value, 0);
  const std::vector<float> v(rec.layers[0].value.data.begin(), rec.layers[0].value.data.end());
  CHECK(identical(run("prerope:int4-asym-g32", v, T, d, vspan), run("int4-asym-g32", v, T, d)));
  // Per-channel structure survives pre-RoPE quantization better than post-RoPE.
  Plan pre_plan(1, 1, T, d), post_plan(1, 1, T, d);
  pre_plan.assign_all(Kind::Key, make_format("prerope:int2-asym-ch16"));
  post_plan.assign_all(Kind::Key, make_format("int2-asym-ch16"));
  for (Plan* p : {&pre_plan, &post_plan}) p->assign_all(Kind::Value, make_format("keep-fp32"));
  CHECK(simulate(rec, pre_plan, SimOptions{}).k_err2 < simulate(rec, post_plan, SimOptions{}).k_err2);
}

TEST_CASE("prerope: a recording without pre-RoPE keys is an error naming the format and the recording") {
  const Recording rec = rope_recording(16, 32, false);
  Plan plan(1, 1, 16, 32);
  plan.assign_all(Kind::Key, make_format("prerope:int4-asym-g32"));
  plan.assign_all(Kind::Value, make_format("prerope:int4-asym-g32"));
  CHECK_THROWS_WITH_AS(simulate(rec, plan, SimOptions{}),
                       doctest::Contains("format 'prerope:int4-asym-g32': recording 'rope-rec' has no pre-RoPE keys"),
                       Error);
  Recording no_rope = rope_recording(16, 32, true);
  no_rope.rope.applied = false;
  CHECK_THROWS_WITH_AS(simulate(no_rope, plan, SimOptions{}), doctest::Contains("has no RoPE"), Error);
  CHECK(make_format("prerope:int4-asym-g32")->check_shape(4, 33) != "");
  CHECK_THROWS_AS(make_format("prerope-int4-asym-g32"), ConfigError);
  CHECK(make_format("kvquant-nuq4-1%")->name() == "prerope:outliers1%:nuq4-cal256");
  // prerope: is outermost and single: a wrapper around it would pass in an x that the
  // inner prerope: ignores, and a second one would rotate twice.
  CHECK_THROWS_WITH_AS(make_format("prerope:prerope:int4-asym-g32"), doctest::Contains("one prerope: is enough"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(make_format("prerope:kvquant-nuq4-1%"), doctest::Contains("one prerope: is enough"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(make_format("outliers1%:prerope:int4-asym-g32"),
                       doctest::Contains("put prerope: outermost, e.g. prerope:outliers1%:int4-asym-g32"), ConfigError);
}

TEST_CASE("check_pre_rope_keys: RoPE of the pre-RoPE keys must give the keys, else an error names the span") {
  const int64_t T = 40, d = 32;
  const Recording rec = rope_recording(T, d, true);  // theta 500000, positions 3, 5, ..
  const ConstMatView key{rec.layers[0].key.ptr(), T, d, d};
  SpanInfo span = unit_span(rec, 0, 0, Kind::Key, 0);
  CHECK_NOTHROW(check_pre_rope_keys({key}, {span}, "rec", "KV head", "causes"));
  // fp16 rounding of the keys stays far inside the tolerance.
  std::vector<float> rounded(rec.layers[0].key.data.begin(), rec.layers[0].key.data.begin() + T * d);
  for (float& x : rounded) x = round_to_f16(x);
  CHECK_NOTHROW(check_pre_rope_keys({ConstMatView{rounded.data(), T, d, d}}, {span}, "rec", "KV head", "causes"));

  auto error = [&](const SpanInfo& s, ConstMatView k = {}) {
    try {
      check_pre_rope_keys({k.data ? k : key}, {s}, "rec 'x' layer 3", "KV head", "the causes");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SpanInfo wrong_theta = span;
  wrong_theta.rope_theta = 10000.0;
  const std::string msg = error(wrong_theta);
  CHECK(doctest::String(msg.c_str()) ==
        doctest::Contains("rec 'x' layer 3: RoPE (theta 10000, positions 3..81) of the pre-RoPE keys does not give "
                          "the post-RoPE keys: relative L2 error "));
  CHECK(doctest::String(msg.c_str()) == doctest::Contains("at KV head 0 (the worst of 1"));
  CHECK(doctest::String(msg.c_str()) == doctest::Contains("Likely: the causes"));
  // Rows at other positions (first_token.. when the span has no positions).
  CHECK(error(span_from(span, 0)).empty());
  SpanInfo shifted = span;
  shifted.positions = nullptr;
  shifted.first_token = 5;
  CHECK(doctest::String(error(shifted).c_str()) == doctest::Contains("positions 5..44"));

  // Scaled inverse frequencies (RoPE scaling) are the rotation when the span has them.
  std::vector<float> inv_freq(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)  // the faster half slowed 8x, as linear scaling would
    inv_freq[static_cast<size_t>(i)] = rope_inv_freq(i, d, 500000.0) / (i < d / 4 ? 8.0f : 1.0f);
  std::vector<float> scaled(rec.layers[0].key_pre_rope.ptr(), rec.layers[0].key_pre_rope.ptr() + T * d);
  apply_rope(scaled.data(), make_rope_table(T, rec.positions.data(), inv_freq));
  const ConstMatView scaled_key{scaled.data(), T, d, d};
  SpanInfo with_scaling = span;
  with_scaling.rope_inv_freq = &inv_freq;
  CHECK(error(with_scaling, scaled_key).empty());
  CHECK(doctest::String(error(span, scaled_key).c_str()) == doctest::Contains("RoPE (theta 500000, positions"));
  CHECK(doctest::String(error(with_scaling).c_str()) ==
        doctest::Contains("theta 500000 with the recording's scaled inverse frequencies"));

  // An odd head_dim has no rotate-half RoPE.
  CHECK(doctest::String(error(span, ConstMatView{key.data, T, d - 1, d}).c_str()) ==
        doctest::Contains("odd head_dim (31)"));
}

TEST_CASE("check_pre_rope_keys: a long span is checked on a spread sample of its rows, which still finds a restart") {
  // 9000 rows (more than the 4096 compared): keys rotated at positions 0..8999 pass; keys
  // whose positions restart at 0 from row 6000 (two sequences run together) are refused.
  const int64_t T = 9000, d = 8;
  std::vector<float> pre(static_cast<size_t>(T * d));
  for (size_t i = 0; i < pre.size(); ++i) pre[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) + 0.5);
  std::vector<int64_t> positions(static_cast<size_t>(T)), restarted(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    positions[static_cast<size_t>(t)] = t;
    restarted[static_cast<size_t>(t)] = t < 6000 ? t : t - 6000;
  }
  std::vector<float> key = pre, key_restarted = pre;
  apply_rope(key.data(), T, d, positions.data(), 10000.0);
  apply_rope(key_restarted.data(), T, d, restarted.data(), 10000.0);
  SpanInfo span;
  span.is_key = true;
  span.key_pre_rope = pre.data();
  span.key_pre_rope_stride = d;
  span.rope_theta = 10000.0;
  CHECK_NOTHROW(check_pre_rope_keys({ConstMatView{key.data(), T, d, d}}, {span}, "long", "KV head", "causes"));
  CHECK_THROWS_WITH_AS(
      check_pre_rope_keys({ConstMatView{key_restarted.data(), T, d, d}}, {span}, "long", "KV head", "causes"),
      doctest::Contains("long: RoPE (theta 10000, positions 0..8999)"), Error);
}
