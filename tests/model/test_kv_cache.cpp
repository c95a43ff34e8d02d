// The KV cache as a decoding step reads it (sim/model/kv_cache.h): view_after_append(),
// which keeps each unit's reconstructed versions and re-quantizes only the groups that
// changed, against the plain reference view(), which reconstructs every unit whole. A
// cache grows from a prompt one token at a time (and once by three), and at every length
// every version, plan and estimate is compared bit for bit, for plans with windows,
// groups along tokens, sink tokens, phases that switch where the marker comes, pre-RoPE
// keys, estimators and formats fitted to their span.
#include <omp.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "sim/formats/registry.h"
#include "sim/model/kv_cache.h"
#include "test_util.h"

using namespace kvb;

namespace {

constexpr int64_t kLayers = 2, kKvHeads = 2, kHeadDim = 128;

struct Case {
  std::string name;
  // Segments of every key / value unit as (first token, format) over the plan's 24 tokens.
  std::vector<std::pair<int64_t, std::string>> keys, values;
  RecentWindow key_window, value_window;
  int64_t phase_boundary = 0;  // > 0: the second phase starts at the last segment, switched by a marker
};

std::vector<Case> cases() {
  const FormatPtr fp16 = make_format("keep-fp16"), int8 = make_format("int8-asym-tok");
  return {
      {"per-token groups", {{0, "int4-asym-g32"}}, {{0, "q4_0"}}, {}, {}},
      {"groups along tokens, sliding and chunked windows",
       {{0, "int2-asym-ch32"}},
       {{0, "int3-asym-ch8"}},
       RecentWindow{8, fp16, RecentWindow::Mode::Sliding},
       RecentWindow{16, int8, RecentWindow::Mode::Chunked}},
      {"sink tokens, a span-fitted bulk, a whole-span channel format",
       {{0, "keep-fp16"}, {4, "nvfp4"}},
       {{0, "keep-fp16"}, {4, "int3-asym-ch"}},
       {},
       {}},
      {"pre-RoPE keys, calibrated values", {{0, "prerope:int2-asym-ch32"}}, {{0, "fp8-e4m3-cal64"}}, {}, {}},
      {"estimated keys, split turbo values", {{0, "qjl-m64"}}, {{0, "turbo-2-o32b3"}}, {}, {}},
      {"KVQuant-style keys (pre-RoPE, outliers, NUQ fitted on 32 tokens), NUQ values",
       {{0, "prerope:outliers1%:nuq2-cal32"}},
       {{0, "nuq3-cal32"}},
       {},
       {}},
      {"windows in formats fitted to their span",
       {{0, "int2-asym-g32"}},
       {{0, "int2-asym-ch8"}},
       RecentWindow{8, make_format("nvfp4"), RecentWindow::Mode::Sliding},
       RecentWindow{16, make_format("fp8-e4m3-cal16"), RecentWindow::Mode::Chunked}},
      {"a second phase where the marker comes", {{0, "int4-asym-g32"}, {12, "int2-asym-ch32"}},
       {{0, "mxfp4"}, {12, "int2-asym-g64"}}, {}, {}, 12},
  };
}

Plan plan_for(const Case& c) {
  const int64_t T = 24;
  Plan plan(kLayers, kKvHeads, T, kHeadDim);
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t g = 0; g < kKvHeads; ++g)
      for (const Kind kind : {Kind::Key, Kind::Value}) {
        const auto& segs = kind == Kind::Key ? c.keys : c.values;
        UnitPlan& u = plan.unit(l, g, kind);
        u.segments.clear();
        for (size_t i = 0; i < segs.size(); ++i) {
          const int64_t end = i + 1 < segs.size() ? segs[i + 1].first : T;
          const SegmentRole role = segs[i].second == "keep-fp16" ? SegmentRole::SinkToken : SegmentRole::Allocated;
          u.segments.push_back(Segment{segs[i].first, end, make_format(segs[i].second), role});
        }
        u.window = kind == Kind::Key ? c.key_window : c.value_window;
      }
  if (c.phase_boundary > 0) {
    plan.set_phase_boundary(c.phase_boundary);
    plan.set_phase_marker(7);
  }
  REQUIRE(plan.check().empty());
  return plan;
}

bool same_floats(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// Every version, the unit plans and the estimates of two views of a cache of `length` tokens.
void check_same_view(const KvLayerView& got, const KvLayerView& want, int64_t length) {
  CHECK(got.prefill == want.prefill);
  const std::vector<float> queries = test::random_normal(3 * kHeadDim, 11);
  for (const Kind kind : {Kind::Key, Kind::Value})
    for (int64_t g = 0; g < kKvHeads; ++g) {
      CAPTURE(kind_name(kind));
      CAPTURE(g);
      const KvUnitView& a = (kind == Kind::Key ? got.keys : got.values)[static_cast<size_t>(g)];
      const KvUnitView& b = (kind == Kind::Key ? want.keys : want.values)[static_cast<size_t>(g)];
      CHECK(same_floats(a.exact, b.exact, length * kHeadDim));
      CHECK(same_floats(a.stored, b.stored, length * kHeadDim));
      REQUIRE((a.window == nullptr) == (b.window == nullptr));
      if (a.window) CHECK(same_floats(a.window, b.window, length * kHeadDim));
      REQUIRE(a.plan.segments.size() == b.plan.segments.size());
      for (size_t s = 0; s < a.plan.segments.size(); ++s) {
        CHECK(a.plan.segments[s].begin == b.plan.segments[s].begin);
        CHECK(a.plan.segments[s].end == b.plan.segments[s].end);
        CHECK(a.plan.segments[s].format->name() == b.plan.segments[s].format->name());
      }
      REQUIRE(a.estimated.size() == b.estimated.size());
      for (size_t s = 0; s < a.estimated.size(); ++s) {
        const EstimatedKeys &ea = a.estimated[s], &eb = b.estimated[s];
        CHECK(ea.begin == eb.begin);
        CHECK(ea.end == eb.end);
        const int64_t n = ea.end - ea.begin;
        std::vector<float> oa(static_cast<size_t>(3 * n)), ob(oa.size());
        ea.estimator->estimate(ConstMatView{queries.data(), 3, kHeadDim, kHeadDim}, n, MatView{oa.data(), 3, n, n});
        eb.estimator->estimate(ConstMatView{queries.data(), 3, kHeadDim, kHeadDim}, n, MatView{ob.data(), 3, n, n});
        CHECK(same_floats(oa.data(), ob.data(), 3 * n));
      }
    }
}

}  // namespace

TEST_CASE("view_after_append gives the reference view's bits at every length of a growing cache") {
  const int64_t tokens = 90, width = kKvHeads * kHeadDim;
  const std::vector<float> keys = test::random_normal(static_cast<size_t>(tokens * width), 1);
  const std::vector<float> values = test::random_normal(static_cast<size_t>(tokens * width), 2);
  const std::vector<float> pre_rope = test::random_normal(static_cast<size_t>(tokens * width), 3);
  CacheRope rope;
  rope.applied = true;
  rope.model = "growing";
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Plan plan = plan_for(c);
    KvCache cache(kLayers, kKvHeads, kHeadDim, rope);
    CacheQuantization q{&plan, 5};
    int64_t length = 0, reused_steps = 0;
    // A 10-token prompt, then one token a step, once three at a time; the seed changes once.
    for (int64_t step = 0; length < tokens; ++step) {
      const int64_t n = length == 0 ? 10 : step == 20 ? 3 : 1;
      if (step == 40) q.seed = 6;
      // The phase marker arrives at token 30 (a plan with phases).
      if (c.phase_boundary > 0 && length + n > 30) q.second_phase = 30;
      for (int64_t l = 0; l < kLayers; ++l) {
        cache.append_pre_rope_keys(l, pre_rope.data() + length * width, width, n);
        cache.append(l, keys.data() + length * width, values.data() + length * width, width, n);
      }
      length += n;
      CAPTURE(length);
      for (int64_t l = 0; l < kLayers; ++l) {
        std::vector<float> scratch, reference_scratch;
        const KvLayerView got = cache.view_after_append(l, q, n, scratch);
        const KvLayerView want = cache.view(l, q, reference_scratch);
        reused_steps += got.keys[0].stored != scratch.data();
        check_same_view(got, want, length);
      }
    }
    CHECK(reused_steps > 100);  // the kept versions were used, not the scratch
  }
}

TEST_CASE("view_after_append: plans that change between steps, exact steps, a copied cache, steps on two threads") {
  // Every step may read another plan (the cases in turn, every 3 steps, an exact step
  // between some), a window appears and disappears, and twice a step appends 200 tokens,
  // enough for the units to run on OpenMP's threads. Halfway the cache is copied and the
  // copy goes on.
  const int64_t tokens = 520, width = kKvHeads * kHeadDim;
  const std::vector<float> keys = test::random_normal(static_cast<size_t>(tokens * width), 4);
  const std::vector<float> values = test::random_normal(static_cast<size_t>(tokens * width), 5);
  const std::vector<float> pre_rope = test::random_normal(static_cast<size_t>(tokens * width), 6);
  std::vector<Plan> plans;
  for (const Case& c : cases()) plans.push_back(plan_for(c));
  CacheRope rope;
  rope.applied = true;
  rope.model = "rotating";
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  KvCache cache(kLayers, kKvHeads, kHeadDim, rope);
  int64_t length = 0;
  for (int64_t step = 0; length < tokens; ++step) {
    const int64_t n = length == 0 ? 10 : (step == 12 || step == 30) ? 200 : 1;
    for (int64_t l = 0; l < kLayers; ++l) {
      cache.append_pre_rope_keys(l, pre_rope.data() + length * width, width, n);
      cache.append(l, keys.data() + length * width, values.data() + length * width, width, n);
    }
    length += n;
    if (step == 20) {
      const KvCache copy = cache;
      cache = copy;
    }
    CAPTURE(length);
    const size_t which = static_cast<size_t>(step / 3) % (plans.size() + 1);
    CacheQuantization q{which < plans.size() ? &plans[which] : nullptr, 5};
    if (q.plan && q.plan->phase_marker() && length > 30) q.second_phase = 30;
    for (int64_t l = 0; l < kLayers; ++l) {
      std::vector<float> scratch, reference_scratch;
      check_same_view(cache.view_after_append(l, q, n, scratch), cache.view(l, q, reference_scratch), length);
    }
  }
  omp_set_num_threads(threads);
}

TEST_CASE("view_after_append: a format's overflow names the token, as the reference does, and nothing stale is kept") {
  const FormatPtr fp16 = make_format("keep-fp16");
  Plan plan(1, 1, 8, kHeadDim);
  plan.assign_all(Kind::Key, fp16);
  plan.assign_all(Kind::Value, fp16);
  KvCache cache(1, 1, kHeadDim);
  const CacheQuantization q{&plan, 0};
  std::vector<float> row(kHeadDim, 0.5f), scratch, reference_scratch;
  for (int64_t t = 0; t < 6; ++t) {
    cache.append(0, row.data(), row.data(), kHeadDim, 1);
    cache.view_after_append(0, q, 1, scratch);
  }
  row[5] = 1e6f;  // beyond fp16's range
  cache.append(0, row.data(), row.data(), kHeadDim, 1);
  std::string got, want;
  try {
    cache.view_after_append(0, q, 1, scratch);
  } catch (const Error& e) {
    got = e.what();
  }
  try {
    cache.view(0, q, reference_scratch);
  } catch (const Error& e) {
    want = e.what();
  }
  CHECK(got == want);
  CHECK(got.find("layer 0 kv_head 0 K: format 'keep-fp16' turned 1 finite key element(s) into Inf or NaN (the first "
                 "at token 6, channel 5") != std::string::npos);
  // After a reset the cache holds another sequence: nothing of the first is reused.
  cache.reset(CacheRope{});
  const std::vector<float> fresh = test::random_normal(3 * kHeadDim, 9);
  for (int64_t t = 0; t < 3; ++t) {
    cache.append(0, fresh.data() + t * kHeadDim, fresh.data() + t * kHeadDim, kHeadDim, 1);
    const KvLayerView a = cache.view_after_append(0, q, 1, scratch);
    const KvLayerView b = cache.view(0, q, reference_scratch);
    CHECK(same_floats(a.keys[0].stored, b.keys[0].stored, (t + 1) * kHeadDim));
    CHECK(same_floats(a.values[0].stored, b.values[0].stored, (t + 1) * kHeadDim));
  }
}

TEST_CASE("view_after_append: NUQ's kept codebooks do not outlive their sequence or their plan") {
  // Codebooks fitted on the first 8 tokens, kept between steps (GrowthMemo): a reset
  // followed by another sequence, and a plan made anew (the old one freed) at every
  // step of the second sequence, must still give the reference's bits.
  auto make_plan = [] {
    Plan plan(1, 1, 24, kHeadDim);
    plan.assign_all(Kind::Key, make_format("nuq3-cal8"));
    plan.assign_all(Kind::Value, make_format("outliers1%:nuq2-cal8"));
    return std::make_unique<Plan>(std::move(plan));
  };
  KvCache cache(1, 1, kHeadDim);
  std::vector<float> scratch, reference_scratch;
  for (const uint64_t seed : {11u, 12u}) {
    CAPTURE(seed);
    cache.reset(CacheRope{});
    const std::vector<float> rows = test::random_normal(static_cast<size_t>(24 * kHeadDim), seed);
    std::unique_ptr<Plan> plan = make_plan();
    for (int64_t t = 0; t < 24; ++t) {
      CAPTURE(t);
      if (seed == 12) plan = make_plan();
      const CacheQuantization q{plan.get(), 0};
      cache.append(0, rows.data() + t * kHeadDim, rows.data() + t * kHeadDim, kHeadDim, 1);
      const KvLayerView a = cache.view_after_append(0, q, 1, scratch);
      const KvLayerView b = cache.view(0, q, reference_scratch);
      CHECK(same_floats(a.keys[0].stored, b.keys[0].stored, (t + 1) * kHeadDim));
      CHECK(same_floats(a.values[0].stored, b.values[0].stored, (t + 1) * kHeadDim));
    }
  }
  // One plan kept across a reset, the next sequence from a 12-token prompt (a step that
  // builds every unit anew): the codebooks of the sequence before must be dropped, though
  // their format object and its row count would let them through (a helper's review).
  const std::unique_ptr<Plan> kept = make_plan();
  const CacheQuantization q{kept.get(), 0};
  for (const uint64_t seed : {13u, 14u}) {
    CAPTURE(seed);
    cache.reset(CacheRope{});
    const std::vector<float> rows = test::random_normal(static_cast<size_t>(24 * kHeadDim), seed);
    for (int64_t length = 0; length < 24;) {
      const int64_t n = length == 0 ? 12 : 1;
      cache.append(0, rows.data() + length * kHeadDim, rows.data() + length * kHeadDim, kHeadDim, n);
      length += n;
      CAPTURE(length);
      const KvLayerView a = cache.view_after_append(0, q, n, scratch);
      const KvLayerView b = cache.view(0, q, reference_scratch);
      CHECK(same_floats(a.keys[0].stored, b.keys[0].stored, length * kHeadDim));
      CHECK(same_floats(a.values[0].stored, b.values[0].stored, length * kHeadDim));
    }
  }
}
