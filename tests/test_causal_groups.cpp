// Groups along tokens (int ch<G>, ch) in a causal cache (sim/plan.h, methods.md §3):
// a group stays in the residual (the window's precision, else exact) until a token
// after it is written, so no query's metrics depend on a later token. Checked by
// cutting the recording (or the model's KV cache) right after the query: the same
// numbers, for the simulator's fast path and fp64 reference (bit for bit) and for the
// model's quantized KV cache (within its matrix products' rounding); and the memory
// that open groups cost.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "recording_test_util.h"
#include "sim/formats/registry.h"
#include "sim/model/attention.h"
#include "sim/model/kv_cache.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "sim/window_rule.h"
#include "test_util.h"

using namespace kvb;

namespace {

struct Case {
  std::string name;
  std::string key_format, value_format;
  RecentWindow key_window, value_window;
  int64_t prefill = 0;
  bool sink_tokens = false;  // tokens [0, 4) in keep-fp16, a segment of their own
  int64_t phase_end = 0;     // > 0: tokens from here on in int2-asym-g32, a second phase
};

std::vector<Case> cases() {
  const FormatPtr fp16 = make_format("keep-fp16"), int8 = make_format("int8-asym-tok");
  return {
      {"ch32 keys, ch8 values, no window", "int2-asym-ch32", "int3-asym-ch8", {}, {}},
      {"whole-span channels, closed when their phase ends at token 40", "int3-asym-ch", "int2-asym-ch", {}, {}, 0,
       false, 40},
      {"sink tokens, then ch16 from token 4", "int2-asym-ch16", "int2-sym-ch8", {}, {}, 0, true},
      {"sliding windows shorter than a group", "int2-asym-ch32", "int2-asym-ch32",
       RecentWindow{8, fp16, RecentWindow::Mode::Sliding}, RecentWindow{4, int8, RecentWindow::Mode::Sliding}},
      {"chunked key window, extra-copy value window, prefill", "int2-asym-ch32", "int3-asym-ch16",
       RecentWindow{16, fp16, RecentWindow::Mode::Chunked}, RecentWindow{8, fp16, RecentWindow::Mode::Sliding, true},
       5},
      {"per-token values beside ch keys", "int2-asym-ch32", "int2-asym-g32", {}, {}},
  };
}

Plan plan_for(int64_t layers, int64_t kv_heads, int64_t T, int64_t d, const Case& c) {
  Plan plan(layers, kv_heads, T, d);
  const FormatPtr fp16 = make_format("keep-fp16");
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t g = 0; g < kv_heads; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) {
        UnitPlan& u = plan.unit(l, g, k);
        const FormatPtr f = make_format(k == Kind::Key ? c.key_format : c.value_format);
        const int64_t sinks = c.sink_tokens ? std::min<int64_t>(4, T) : 0;
        u.segments.clear();
        const int64_t bulk_end = c.phase_end > 0 ? std::min(c.phase_end, T) : T;
        if (sinks > 0) u.segments.push_back(Segment{0, sinks, fp16, SegmentRole::SinkToken});
        if (bulk_end > sinks) u.segments.push_back(Segment{sinks, bulk_end, f});
        if (T > bulk_end) u.segments.push_back(Segment{bulk_end, T, make_format("int2-asym-g32")});
        u.window = k == Kind::Key ? c.key_window : c.value_window;
      }
  plan.set_prefill(std::min(c.prefill, T));
  REQUIRE(plan.check().empty());
  return plan;
}

// Every metric of the rows, compared exactly.
void check_same_rows(const ErrorStats& full, const ErrorStats& cut) {
  REQUIRE(full.rows.size() == cut.rows.size());
  for (size_t i = 0; i < full.rows.size(); ++i) {
    const AttentionRow &a = full.rows[i], &b = cut.rows[i];
    INFO("layer " << a.layer << " head " << a.q_head << " t " << a.position);
    REQUIRE(a.position == b.position);
    CHECK(a.kl == b.kl);
    CHECK(a.logit_err2 == b.logit_err2);
    CHECK(a.logit_err_max == b.logit_err_max);
    CHECK(a.topk_overlap == b.topk_overlap);
    CHECK(a.out_err2 == b.out_err2);
    CHECK(a.out_norm2 == b.out_norm2);
  }
}

}  // namespace

TEST_CASE("simulator: a query's metrics do not change when the recording is cut right after it") {
  const Recording full = test::random_recording(4, 2, 96, 32, 71);
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Plan full_plan = plan_for(full.num_layers(), full.kv_heads, full.tokens, full.head_dim, c);
    double kl_sum = 0;
    // Queries inside a group, completing one, just after one, and in a later group.
    for (int64_t t : {6, 15, 31, 32, 47, 70}) {
      CAPTURE(t);
      Recording cut = full;
      cut.truncate_tokens(t + 1);
      const Plan cut_plan = plan_for(cut.num_layers(), cut.kv_heads, cut.tokens, cut.head_dim, c);
      SimOptions opt;
      opt.row_block = 16;  // several blocks, the same ones in both runs
      for (int64_t p = 0; p <= t; ++p) opt.positions.push_back(p);
      for (bool reference : {false, true}) {
        CAPTURE(reference);
        opt.reference = reference;
        const ErrorStats a = simulate(full, full_plan, opt), b = simulate(cut, cut_plan, opt);
        check_same_rows(a, b);
        for (const AttentionRow& r : a.rows) kl_sum += r.kl;
      }
    }
    CHECK(kl_sum > 0);  // closed groups are quantized: the check compares real errors
  }
}

TEST_CASE("simulator: open groups are read at the residual precision") {
  // Without a window the open group is exact: a query inside the first group of a
  // ch32 unit reads no error at all; from token 32 on, the closed group [0, 32) is.
  const Recording rec = test::random_recording(2, 1, 64, 32, 5);
  const Case c{"ch32", "int2-asym-ch32", "int2-asym-ch32", {}, {}};
  const Plan plan = plan_for(rec.num_layers(), rec.kv_heads, rec.tokens, rec.head_dim, c);
  for (bool reference : {false, true}) {
    SimOptions opt;
    opt.reference = reference;
    const ErrorStats s = simulate(rec, plan, opt);
    for (const AttentionRow& r : s.rows) {
      CAPTURE(r.position);
      if (r.position < 32) {
        CHECK(r.kl == 0.0f);
        CHECK(r.out_err2 == 0.0f);
      } else {
        CHECK(r.kl > 0.0f);
      }
    }
  }
  // The rule itself: groups of G from the segment's first token, open through the
  // query that completes them; a whole-span group is open to the segment's end.
  UnitPlan u;
  u.segments = {Segment{0, 4, make_format("keep-fp16")}, Segment{4, 100, make_format("int2-asym-ch32")}};
  CHECK(open_group_begin(u, 2) == 3);    // keep-fp16: tokens one by one, nothing open
  CHECK(open_group_begin(u, 4) == 4);
  CHECK(open_group_begin(u, 35) == 4);   // [4, 36) is open while its last token attends
  CHECK(open_group_begin(u, 36) == 36);  // then closed
  CHECK(open_group_begin(u, 99) == 68);
  u.segments[1].format = make_format("int2-asym-ch");
  CHECK(open_group_begin(u, 99) == 4);
  const RowVersions before_prefill = row_versions(u, 10, 9);
  CHECK(before_prefill.of(0) == Seen::Exact);
  const RowVersions v = row_versions(u, 0, 50);
  CHECK(v.of(3) == Seen::Stored);
  CHECK(v.of(4) == Seen::Exact);  // no window: the residual is exact
  u.window = RecentWindow{8, make_format("keep-fp16")};
  CHECK(row_versions(u, 0, 50).of(4) == Seen::Window);
  // KIVI (the kivi-2 preset): a chunked 128-token window from token 0 holds every open
  // ch32 group, so its residual is the window's alone, as before groups were causal.
  UnitPlan kivi;
  kivi.segments = {Segment{0, 1000, make_format("int2-asym-ch32")}};
  kivi.window = RecentWindow{128, make_format("keep-fp16"), RecentWindow::Mode::Chunked};
  int64_t beyond_window = 0;
  for (int64_t t = 0; t < 1000; ++t)
    beyond_window += row_versions(kivi, 0, t).residual_begin != window_first_held(128, true, t, 0);
  CHECK(beyond_window == 0);
}

TEST_CASE("residual_begins: row_versions' residual_begin for every position, in any order") {
  const int64_t T = 100;
  for (const Case& c : cases()) {
    INFO(c.name);
    const Plan plan = plan_for(1, 1, T, 64, c);
    std::vector<int32_t> ascending(T), mixed;
    for (int32_t t = 0; t < T; ++t) ascending[static_cast<size_t>(t)] = t;
    for (int32_t t : {70, 3, 99, 0, 41, 41, 40, 4, 5, 63, 64, 31, 32}) mixed.push_back(t);  // back and forth
    for (const std::vector<int32_t>* positions : {&ascending, &mixed})
      for (Kind k : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = plan.unit(0, 0, k);
        std::vector<int32_t> got(positions->size(), -1);
        residual_begins(u, plan.prefill(), positions->data(), positions->size(), got.data());
        for (size_t i = 0; i < positions->size(); ++i) {
          const int32_t t = (*positions)[i];
          CAPTURE(t);
          CHECK(got[i] == row_versions(u, plan.prefill(), t).residual_begin);
        }
      }
  }
  UnitPlan none;  // a unit without segments: every token is its own (t + 1)
  const int32_t t[] = {0, 7};
  int32_t got[2];
  residual_begins(none, 0, t, 2, got);
  CHECK(got[0] == 1);
  CHECK(got[1] == 8);
}

TEST_CASE("memory: an open group costs the residual's precision, not its format's") {
  const int64_t T = 64, d = 32;
  const FormatPtr ch32 = make_format("int2-asym-ch32"), fp16 = make_format("keep-fp16"),
                  fp32 = make_format("keep-fp32");
  auto plan_with = [&](const FormatPtr& key, RecentWindow window) {
    Plan p(1, 1, T, d);
    p.unit(0, 0, Kind::Key).segments = {Segment{0, T, key}};
    p.unit(0, 0, Kind::Key).window = window;
    p.unit(0, 0, Kind::Value).segments = {Segment{0, T, fp16}};
    REQUIRE(p.check().empty());
    return p;
  };
  const uint64_t values_at_64 = fp16->storage_bits(64, d);
  // No window: the last query (t = 63) holds [32, 64) open, in fp16.
  const Plan none = plan_with(ch32, {});
  CHECK(none.storage_bits() == ch32->storage_bits(32, d) + 16u * 32 * d + values_at_64);
  CHECK(none.storage_bits_at(33) == ch32->storage_bits(32, d) + 16u * 1 * d + fp16->storage_bits(33, d));
  CHECK(none.storage_bits_at(100) == ch32->storage_bits(96, d) + 16u * 4 * d + fp16->storage_bits(100, d));
  // A whole-span group never closes while the cache grows: everything in fp16.
  CHECK(plan_with(make_format("int2-asym-ch"), {}).storage_bits() == 16u * 64 * d + values_at_64);
  // A sliding window of 8 (fp32) holds [56, 64); the open tokens [32, 56) outside it are
  // at the window's precision too.
  const Plan sliding = plan_with(ch32, RecentWindow{8, fp32});
  CHECK(sliding.storage_bits() == ch32->storage_bits(32, d) + fp32->storage_bits(24, d) +
                                      fp32->storage_bits(8, d) + values_at_64);
  // The same window as an extra copy: the quantized cache holds every closed group.
  const Plan copy = plan_with(ch32, RecentWindow{8, fp32, RecentWindow::Mode::Sliding, true});
  CHECK(copy.storage_bits() == sliding.storage_bits());
  CHECK(copy.storage_bits_at(40) == ch32->storage_bits(32, d) + fp32->storage_bits(8, d) + fp16->storage_bits(40, d));
  // A chunked window aligned with the groups (KIVI) already holds every open group.
  const Plan kivi = plan_with(ch32, RecentWindow{32, fp16, RecentWindow::Mode::Chunked});
  CHECK(kivi.storage_bits() == ch32->storage_bits(32, d) + fp16->storage_bits(32, d) + values_at_64);
  CHECK(kivi.storage_bits_at(40) == ch32->storage_bits(32, d) + fp16->storage_bits(8, d) + fp16->storage_bits(40, d));
  // Formats quantizing token by token are unaffected.
  const FormatPtr g32 = make_format("int2-asym-g32");
  CHECK(plan_with(g32, {}).storage_bits() == g32->storage_bits(64, d) + values_at_64);
}

TEST_CASE("model: the KV cache's attention outputs do not change when the cache is cut right after a query") {
  // The model path (sim/model/kv_cache.h, attention.h) on the recording's layer 0: the
  // cache of T tokens against the cache of t + 1 tokens, every query p <= t. Both
  // caches hold the same rows, so every version a query reads is bit for bit the same;
  // the attention's matrix products of other shapes round differently (last bits), so
  // outputs agree within 1e-5 of their scale, while a later token's group statistics
  // would move them by the quantization error itself (checked to exceed 1e-2 here).
  // (A whole forward pass of t + 1 tokens also rounds its projections differently
  // from one of T tokens, and quantization can turn those last-bit differences into a
  // rounding step: the cache is where the time semantics live.)
  const Recording rec = test::random_recording(4, 2, 96, 32, 71);
  const LayerTensors& L = rec.layers[0];
  const int64_t T = rec.tokens, d = rec.head_dim, kv = rec.kv_heads, qh = rec.q_heads;
  // Rows [T, heads * d], heads concatenated, as the model's projections write them.
  auto rows_of = [&](const Tensor& x, int64_t heads) {
    std::vector<float> r(static_cast<size_t>(T * heads * d));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < T; ++j)
        std::copy(x.slice(h) + j * d, x.slice(h) + (j + 1) * d, r.begin() + (j * heads + h) * d);
    return r;
  };
  const std::vector<float> keys = rows_of(L.key, kv), values = rows_of(L.value, kv), queries = rows_of(L.query, qh);
  const AttentionGeometry geo{qh, kv, d, 1.0f / std::sqrt(static_cast<float>(d))};
  // Attention outputs [n, q_heads * d] of queries 0..n-1 over a cache of n tokens.
  auto outputs = [&](int64_t n, const Case* c) {
    const Plan plan = c ? plan_for(1, kv, n, d, *c) : Plan();
    KvCache cache(1, kv, d);
    cache.append(0, keys.data(), values.data(), kv * d, n);
    std::vector<float> scratch, out(static_cast<size_t>(n * qh * d));
    const KvLayerView view = cache.view(0, CacheQuantization{c ? &plan : nullptr, 0}, scratch);
    causal_attention(queries.data(), qh * d, n, n, view, geo, out.data());
    return out;
  };
  // The largest |a - b| over query p's outputs, relative to the largest |b|.
  auto rel_diff = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t p) {
    double diff = 0, scale = 0;
    for (int64_t i = p * qh * d; i < (p + 1) * qh * d; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    return diff / scale;
  };
  const std::vector<float> exact = outputs(T, nullptr);
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const std::vector<float> full = outputs(T, &c);
    double worst = 0, effect = 0;
    for (int64_t t : {6, 15, 31, 32, 47, 70}) {
      const std::vector<float> cut = outputs(t + 1, &c);
      for (int64_t p = 0; p <= t; ++p) {
        worst = std::max(worst, rel_diff(cut, full, p));
        effect = std::max(effect, rel_diff(full, exact, p));
      }
    }
    CHECK(worst <= 1e-5);
    CHECK(effect > 1e-2);
  }
}
