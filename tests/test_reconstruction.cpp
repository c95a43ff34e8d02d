// The shared cache reconstruction (sim/reconstruction.h): spans, the versions of a
// unit, the finiteness check and quantize_tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/formats/registry.h"
#include "sim/reconstruction.h"
#include "test_util.h"

namespace kvb {

namespace {

// One layer, two KV heads of T tokens x d, positions 5, 7, 9, ..., pre-RoPE keys.
Recording small_recording(int64_t T, int64_t d) {
  Recording rec;
  rec.name = "recon-rec";
  rec.source = "test";
  rec.q_heads = 2;
  rec.kv_heads = 2;
  rec.head_dim = d;
  rec.tokens = T;
  rec.layer_ids = {0};
  rec.rope.applied = true;
  rec.rope.theta = 20000.0;
  for (int64_t t = 0; t < T; ++t) rec.positions.push_back(5 + 2 * t);
  LayerTensors L;
  for (Tensor* x : {&L.query, &L.key, &L.value, &L.key_pre_rope}) {
    *x = Tensor({2, T, d});
    x->data = test::random_normal(static_cast<size_t>(2 * T * d), 40 + static_cast<uint64_t>(x - &L.query));
  }
  rec.layers.push_back(std::move(L));
  return rec;
}

bool same_floats(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// A unit's plan as it grows: segments from each (first token, format) to the next start
// (the last one to T), cut at T, and a window.
struct GrowingPlan {
  std::vector<std::pair<int64_t, FormatPtr>> starts;
  RecentWindow window;

  UnitPlan at(int64_t T) const {
    std::vector<std::pair<int64_t, FormatPtr>> sorted = starts;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    UnitPlan unit;
    unit.window = window;
    for (size_t i = 0; i < sorted.size(); ++i) {
      const int64_t begin = std::min(sorted[i].first, T);
      const int64_t end = i + 1 < sorted.size() ? std::min(sorted[i + 1].first, T) : T;
      if (end > begin) unit.segments.push_back(Segment{begin, end, sorted[i].second});
    }
    return unit;
  }
};

// What a unit's reconstruction gave: versions, how many estimated segments, or the error.
struct Versions {
  std::vector<float> stored, window;
  size_t estimated = 0;
  std::string error;
};

}  // namespace

TEST_CASE("unit_span: a recording's identity, RoPE context and pre-RoPE keys (keys only); span_from moves along") {
  const int64_t T = 12, d = 8;
  const Recording rec = small_recording(T, d);
  const SpanInfo k = unit_span(rec, 0, 1, Kind::Key, 77);
  CHECK(k.layer == 0);
  CHECK(k.kv_head == 1);
  CHECK(k.is_key);
  CHECK(k.first_token == 0);
  CHECK(k.seed == 77);
  CHECK(std::string(k.recording) == "recon-rec");
  CHECK(k.rope_applied);
  CHECK(k.rope_theta == 20000.0);
  CHECK(k.rope_inv_freq == nullptr);  // no scaled frequencies: theta's
  CHECK(k.positions == rec.positions.data());
  CHECK(k.key_pre_rope == rec.layers[0].key_pre_rope.slice(1));
  CHECK(k.key_pre_rope_stride == d);
  const SpanInfo v = unit_span(rec, 0, 1, Kind::Value, 77);
  CHECK_FALSE(v.is_key);
  CHECK(v.key_pre_rope == nullptr);

  const SpanInfo later = span_from(k, 5);
  CHECK(later.first_token == 5);
  CHECK(later.key_pre_rope == k.key_pre_rope + 5 * d);
  CHECK(later.positions == rec.positions.data() + 5);
  CHECK(span_from(later, 2).first_token == 7);

  // A source without positions or pre-RoPE keys (the model's cache, `kvbudget quantize`).
  const std::vector<float> scaled = {1.0f, 0.5f, 0.25f, 0.125f};
  SpanSource src;
  src.name = "model";
  src.rope_inv_freq = &scaled;
  const SpanInfo m = unit_span(src, 3, 0, Kind::Key, 1);
  CHECK(m.layer == 3);
  CHECK(m.rope_inv_freq == &scaled);
  CHECK(m.positions == nullptr);
  CHECK(m.key_pre_rope == nullptr);
  const std::vector<float> none;
  src.rope_inv_freq = &none;  // empty: theta's frequencies, as a null pointer says
  CHECK(unit_span(src, 0, 0, Kind::Key, 1).rope_inv_freq == nullptr);
}

TEST_CASE("reconstruct_unit_versions: segments with their own spans, the window version, estimated key segments") {
  const int64_t T = 16, d = 32, split = 6;
  const Recording rec = small_recording(T, d);
  const float* x = rec.layers[0].key.slice(1);
  UnitPlan unit;
  unit.segments = {{0, split, make_format("int4-asym-g32")}, {split, T, make_format("qjl-m64")}};
  unit.window.size = 4;
  unit.window.format = make_format("int8-asym-g32");
  const SpanInfo span = unit_span(rec, 0, 1, Kind::Key, 9);
  std::vector<float> stored(T * d), window(T * d);
  std::vector<EstimatedKeys> estimated(3);  // replaced, not appended to
  reconstruct_unit_versions(unit, x, T, d, span, stored.data(), window.data(), estimated);

  // Each segment is its format's roundtrip with the span shifted to its first token.
  for (const Segment& seg : unit.segments) {
    const int64_t n = seg.end - seg.begin;
    std::vector<float> expect(n * d);
    seg.format->roundtrip(ConstMatView{x + seg.begin * d, n, d, d}, MatView{expect.data(), n, d, d},
                          span_from(span, seg.begin));
    CHECK(same_floats(stored.data() + seg.begin * d, expect.data(), n * d));
  }
  std::vector<float> expect_window(T * d);
  unit.window.format->roundtrip(ConstMatView{x, T, d, d}, MatView{expect_window.data(), T, d, d}, span);
  CHECK(same_floats(window.data(), expect_window.data(), T * d));

  // The QJL segment's logits come from its estimator, kept on the whole segment.
  REQUIRE(estimated.size() == 1);
  CHECK(estimated[0].begin == split);
  CHECK(estimated[0].end == T);
  CHECK(estimated[0].keep_begin == split);
  CHECK(estimated[0].keep_end == T);
  CHECK(estimated[0].estimator->keys() == T - split);

  // Values have no estimated segments, and a unit without a window leaves `window` alone.
  UnitPlan values;
  values.segments = {{0, T, make_format("int4-asym-g32")}};
  std::vector<float> untouched(T * d, 7.0f);
  reconstruct_unit_versions(values, rec.layers[0].value.slice(1), T, d, unit_span(rec, 0, 1, Kind::Value, 9),
                            stored.data(), untouched.data(), estimated);
  CHECK(estimated.empty());
  CHECK(untouched == std::vector<float>(T * d, 7.0f));
}

TEST_CASE("reconstruction refuses a format that turns finite values into Inf, naming token and channel") {
  const int64_t T = 3, d = 2;
  std::vector<float> x = {0.5f, 1.0f, 2.0f, 1e5f, -1.0f, 0.25f};  // 1e5 is beyond fp16's 65504
  UnitPlan unit;
  unit.segments = {{0, 1, make_format("keep-fp32")}, {1, T, make_format("keep-fp16")}};
  std::vector<float> out(T * d);
  SpanInfo span;
  span.is_key = false;
  std::string msg;
  try {
    reconstruct_unit(unit, x.data(), T, d, span, out.data());
  } catch (const NonFiniteReconstruction& e) {
    msg = e.what();
  }
  CHECK(msg == "format 'keep-fp16' turned 1 finite value element(s) into Inf or NaN (the first at token 1, "
               "channel 1: 1e+05): they exceed the format's range");
  unit.window.size = 1;
  unit.window.format = make_format("keep-fp16");
  CHECK_THROWS_AS(reconstruct_window(unit, x.data(), T, d, span, out.data()), NonFiniteReconstruction);
  // Input that was not finite already is the model's own overflow, not the format's.
  x[3] = INFINITY;
  CHECK_NOTHROW(reconstruct_unit(unit, x.data(), T, d, span, out.data()));
}

TEST_CASE("quantize_tensor: spans are units of their own, errors and bits summed over them") {
  const int64_t rows = 10, d = 32, per_span = 4;  // spans of 4, 4 and 2 rows
  Tensor x({2, rows / 2, d});
  x.data = test::random_normal(static_cast<size_t>(rows * d), 5);
  const FormatPtr f = make_format("turbo-3");  // seeded: a rotation per span
  SpanSource src;
  src.name = "file.npy:keys";
  const TensorQuantization r = quantize_tensor(x, *f, per_span, Kind::Key, 11, src);
  CHECK(r.dequantized.shape == x.shape);
  double err2 = 0, norm2 = 0;
  uint64_t bits = 0;
  for (int64_t s = 0, r0 = 0; r0 < rows; ++s, r0 += per_span) {
    const int64_t n = std::min(per_span, rows - r0);
    std::vector<float> expect(n * d);
    f->roundtrip(ConstMatView{x.ptr() + r0 * d, n, d, d}, MatView{expect.data(), n, d, d},
                 unit_span(src, 0, s, Kind::Key, 11));
    CHECK(same_floats(r.dequantized.ptr() + r0 * d, expect.data(), n * d));
    for (int64_t i = 0; i < n * d; ++i) {
      const double a = x.data[r0 * d + i], b = expect[i];
      err2 += (a - b) * (a - b);
      norm2 += a * a;
    }
    bits += f->storage_bits(n, d);
  }
  CHECK(r.storage_bits == bits);
  CHECK(r.err2 == doctest::Approx(err2));
  CHECK(r.relative_mse() == doctest::Approx(err2 / norm2));
  CHECK(r.snr_db() == doctest::Approx(10 * std::log10(norm2 / err2)));
  CHECK(r.nonfinite == 0);
  CHECK(r.codes.bits() > 0);

  // Overflow counts as non-finite output, and the error metrics say so.
  Tensor big({1, 2});
  big.data = {1.0f, 1e6f};
  const TensorQuantization o = quantize_tensor(big, *make_format("keep-fp16"), 1, Kind::Value, 0, src);
  CHECK(o.nonfinite == 1);
  CHECK(o.relative_mse() == INFINITY);
  CHECK(o.snr_db() == -INFINITY);

  // A span shape the format cannot take is a ConfigError naming the source.
  CHECK_THROWS_WITH_AS(quantize_tensor(x, *make_format("int4-asym-g64"), per_span, Kind::Key, 0, src),
                       doctest::Contains("format 'int4-asym-g64' on file.npy:keys"), ConfigError);
}

TEST_CASE("update_unit_versions: reconstruct_unit_versions' bits as a unit grows and its plan changes") {
  // Random plan sequences over formats fitted to their span (whose rows are kept while
  // the fit holds), formats that split at their groups and keys-only ones: segments
  // added, dropped, moved (fitted segments that shrink), formats swapped (also for a new
  // object of the same name), windows switched on and off and their format changed while
  // active; data whose fits hold (each channel's extremes in the first rows), with NaN
  // and inf, with zeros and -0. Each step grows by 0-3 rows and is compared bit for bit,
  // errors included, with the whole reconstruction (a helper's review found shrinking
  // fitted segments and window formats changed while active untested).
  const char* const names[] = {"nvfp4",         "int3-asym-ch",  "int1-sym-ch",          "fp8-e4m3-cal8",
                               "nuq3-cal8",     "nuq2",          "outliers1%:nuq2-cal8", "prerope:nvfp4",
                               "int2-asym-ch8", "int4-asym-g32", "keep-fp32",            "mxfp4",
                               "qjl-m64",       "prerope:int3-asym-ch", "fp8-e5m2-cal5", "nuq1-cal1",
                               "int4-asym-ch-sbf16-zbf16", "turbo-2-o32b3"};
  std::vector<FormatPtr> pool;
  for (const char* n : names) pool.push_back(make_format(n));
  const int64_t d = 32, T_max = 48;
  const Recording rec = small_recording(T_max, d);  // its positions and pre-RoPE keys
  int64_t compared = 0, grown_steps = 0;
  for (uint64_t sequence = 0; sequence < 40; ++sequence) {
    CAPTURE(sequence);
    std::mt19937_64 rng(1000 + sequence);
    auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    std::normal_distribution<float> normal;
    const int data_mode = static_cast<int>(sequence % 4);
    const Kind kind = (sequence / 4) % 2 ? Kind::Key : Kind::Value;
    std::vector<float> x(static_cast<size_t>(T_max * d));
    for (int64_t r = 0; r < T_max; ++r)
      for (int64_t c = 0; c < d; ++c) {
        float v = normal(rng);
        if (data_mode == 1 && r < 2) v = r == 0 ? 40.0f : -40.0f;
        if (data_mode == 2 && uniform(0, 200) == 0) v = uniform(0, 1) ? NAN : INFINITY;
        if (data_mode == 3 && uniform(0, 3) == 0) v = uniform(0, 10) ? 0.0f : -0.0f;
        x[static_cast<size_t>(r * d + c)] = v;
      }
    const SpanInfo span = unit_span(rec, 0, 1, kind, 9);
    auto pick = [&](bool window) {
      for (;;) {
        const FormatPtr& f = pool[static_cast<size_t>(uniform(0, static_cast<int64_t>(pool.size()) - 1))];
        if (!f->keys_only() || (kind == Kind::Key && !window)) return f;
      }
    };
    GrowingPlan growing{{{0, pick(false)}}, {}};
    UnitPlan before;
    int64_t T_before = 0;
    UnitGrowthMemos memos;
    Versions grown{std::vector<float>(x.size()), std::vector<float>(x.size()), 0, {}};
    for (int64_t T = uniform(1, 6); T <= T_max; T += uniform(0, 3)) {
      std::pair<int64_t, FormatPtr>& last = growing.starts.back();
      switch (uniform(0, 9)) {
        case 0:
          if (growing.starts.size() < 5) growing.starts.push_back({uniform(1, T), pick(false)});
          break;
        case 1:
          if (growing.starts.size() > 1) growing.starts.pop_back();
          break;
        case 2: last.second = pick(false); break;
        case 3:
          if (growing.starts.size() > 1) last.first = uniform(1, T_max);
          break;
        case 4: growing.window = growing.window.active() ? RecentWindow{} : RecentWindow{uniform(1, 9), pick(true)}; break;
        case 5:
          if (growing.window.active()) growing.window.format = pick(true);
          break;
        case 6: last.second = make_format(last.second->name()); break;
        default: break;
      }
      const UnitPlan unit = growing.at(T);
      bool fits = !unit.window.active() || unit.window.format->check_shape(T, d).empty();
      for (const Segment& seg : unit.segments) fits = fits && seg.format->check_shape(seg.end - seg.begin, d).empty();
      if (!fits) continue;
      CAPTURE(T);
      CAPTURE(T_before);
      Versions whole{std::vector<float>(x.size(), 777.0f), std::vector<float>(x.size(), 777.0f), 0, {}};
      std::vector<EstimatedKeys> estimated;
      try {
        reconstruct_unit_versions(unit, x.data(), T, d, span, whole.stored.data(), whole.window.data(), estimated);
        whole.estimated = estimated.size();
      } catch (const std::exception& e) {
        whole.error = e.what();
      }
      grown.error.clear();
      try {
        if (T_before == 0) {
          memos = {};
          reconstruct_unit_versions(unit, x.data(), T, d, span, grown.stored.data(), grown.window.data(), estimated);
        } else {
          update_unit_versions(before, T_before, unit, x.data(), T, d, span, grown.stored.data(), grown.window.data(),
                               estimated, &memos);
          ++grown_steps;
        }
        grown.estimated = estimated.size();
      } catch (const std::exception& e) {
        grown.error = e.what();
      }
      ++compared;
      CHECK(grown.error == whole.error);
      if (!whole.error.empty() || !grown.error.empty()) {
        T_before = 0;  // nothing is kept after an error: the next step builds anew
        continue;
      }
      CHECK(same_floats(grown.stored.data(), whole.stored.data(), T * d));
      if (unit.window.active()) CHECK(same_floats(grown.window.data(), whole.window.data(), T * d));
      CHECK(grown.estimated == whole.estimated);
      before = unit;
      T_before = T;
    }
  }
  CHECK(compared > 400);
  CHECK(grown_steps > 300);
}

}  // namespace kvb
