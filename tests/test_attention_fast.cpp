// The fast attention-error path (sim/attention_error_fast.cpp) against the plain fp64
// reference (sim/attention_error_reference.cpp), row by row, over the shapes the
// simulator supports: GQA, windows (sliding, chunked, keys only), prefill, sink heads,
// QJL's estimated logits, large logit shifts, position subsets, attribution regions,
// the bundled recording; and the run's exact-pass cache, which must change nothing.
#include <algorithm>
#include <cmath>

#include "sim/exact_attention.h"
#include "sim/formats/registry.h"
#include "sim/metrics/attention_shift.h"
#include "sim/recording.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "recording_test_util.h"
#include "test_util.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;

namespace {

struct ReferenceAndFast {
  ErrorStats ref, fast;
};

// Every metric of every row within 1e-5 relative of the reference (tiny values within
// an absolute floor), top-k overlaps equal but for rows with near-tied probabilities.
// Returns both results, for a caller's own row checks.
ReferenceAndFast check_against_reference(const Recording& rec, const Plan& plan, SimOptions opt) {
  opt.reference = true;
  ErrorStats ref = simulate(rec, plan, opt);
  opt.reference = false;
  ErrorStats fast = simulate(rec, plan, opt);
  REQUIRE(fast.rows.size() == ref.rows.size());
  CHECK(fast.k_err2 == ref.k_err2);
  CHECK(fast.v_err2 == ref.v_err2);
  CHECK(fast.logit_pairs == ref.logit_pairs);
  int64_t topk_differ = 0;
  double topk_sum_ref = 0, topk_sum_fast = 0;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    const AttentionRow &a = ref.rows[i], &b = fast.rows[i];
    INFO("row " << i << ": layer " << a.layer << " head " << a.q_head << " t " << a.position);
    REQUIRE(b.layer == a.layer);
    REQUIRE(b.q_head == a.q_head);
    REQUIRE(b.position == a.position);
    CHECK(b.kl == doctest::Approx(a.kl).epsilon(1e-5).scale(1e-9));
    CHECK(b.out_norm2 == doctest::Approx(a.out_norm2).epsilon(1e-5));
    CHECK(b.out_err2 == doctest::Approx(a.out_err2).epsilon(1e-5).scale(1e-12));
    CHECK(b.logit_err2 == doctest::Approx(a.logit_err2).epsilon(1e-6));
    CHECK(b.logit_err_max == a.logit_err_max);
    topk_differ += b.topk_overlap != a.topk_overlap;
    topk_sum_ref += a.topk_overlap;
    topk_sum_fast += b.topk_overlap;
  }
  CHECK(topk_differ <= static_cast<int64_t>(ref.rows.size()) / 1000);
  CHECK(topk_sum_fast == doctest::Approx(topk_sum_ref).epsilon(1e-4));
  return {std::move(ref), std::move(fast)};
}

// The fast path with and without the exact-pass cache: bit for bit the same rows.
void check_cache_changes_nothing(const Recording& rec, const Plan& plan, SimOptions opt) {
  const ErrorStats plain = simulate(rec, plan, opt);
  const ExactAttentionCache cache(rec, opt, size_t(1) << 30);
  REQUIRE(cache.heads_cached() == cache.heads_total());
  opt.exact = &cache;
  const ErrorStats cached = simulate(rec, plan, opt);
  REQUIRE(cached.rows.size() == plain.rows.size());
  for (size_t i = 0; i < plain.rows.size(); ++i) {
    const AttentionRow &a = plain.rows[i], &b = cached.rows[i];
    INFO("row " << i);
    CHECK(a.kl == b.kl);
    CHECK(a.topk_overlap == b.topk_overlap);
    CHECK(a.out_err2 == b.out_err2);
    CHECK(a.out_norm2 == b.out_norm2);
    CHECK(a.logit_err2 == b.logit_err2);
    CHECK(a.logit_err_max == b.logit_err_max);
  }
}

}  // namespace

TEST_CASE("fast path: uniform formats, GQA, every position and subsets, the row blocks' edges") {
  const Recording rec = test::random_recording(4, 2, 157, 32, 11);
  for (const char* f : {"int2-asym-g32", "int4-sym-g16", "int8-sym-tok", "q4_0", "int2-asym-ch32", "keep-fp32"}) {
    INFO("format " << f);
    SimOptions opt;
    check_against_reference(rec, uniform_plan(rec, f, f), opt);
    opt.row_block = 16;  // rows not a multiple of the block, blocks not of the lanes
    opt.positions = {0, 1, 2, 15, 16, 17, 40, 63, 64, 100, 155, 156};
    check_against_reference(rec, uniform_plan(rec, f, f), opt);
    opt.topk = 1;
    check_against_reference(rec, uniform_plan(rec, f, f), opt);
    opt.topk = 0;
    check_against_reference(rec, uniform_plan(rec, f, f), opt);
    opt.topk = 200;  // more than any row has keys
    check_against_reference(rec, uniform_plan(rec, f, f), opt);
  }
}

TEST_CASE("fast path: windows, prefill and keys-only windows follow the plan's time semantics") {
  const Recording rec = test::random_recording(4, 2, 150, 32, 5);
  for (auto mode : {RecentWindow::Mode::Sliding, RecentWindow::Mode::Chunked})
    for (bool keys_only : {false, true})
      for (int64_t prefill : {0, 7, 60}) {
        INFO("chunked " << (mode == RecentWindow::Mode::Chunked) << " keys only " << keys_only << " prefill "
                        << prefill);
        SimOptions opt;
        opt.row_block = 32;
        check_against_reference(rec, windowed_plan(rec, mode, keys_only, prefill, 21), opt);
      }
}

TEST_CASE("fast path: tiny errors keep their precision, large shifts take the fp64 form") {
  // keep-fp16 gives Δs of ~1e-4 and KL of ~1e-9: nothing may cancel.
  const Recording rec = test::random_recording(2, 1, 300, 64, 3);
  check_against_reference(rec, uniform_plan(rec, "keep-fp16", "keep-fp16"), SimOptions{});
  check_against_reference(rec, uniform_plan(rec, "keep-bf16", "int8-sym-g32"), SimOptions{});
  // Queries scaled up: int1 keys shift logits by far more than kLargeLogitShift.
  const Recording sharp = test::random_recording(2, 1, 120, 64, 9, 40.0f);
  const Plan plan = uniform_plan(sharp, "int1-sym-g32", "int2-asym-g32");
  check_against_reference(sharp, plan, SimOptions{});
  check_cache_changes_nothing(sharp, plan, SimOptions{});
  const ErrorStats s = simulate(sharp, plan, SimOptions{});
  CHECK(std::any_of(s.rows.begin(), s.rows.end(), [](const AttentionRow& r) { return r.logit_err_max >= 30; }));
}

TEST_CASE("fast path: where p̂ falls orders below p, its top-k ranks p̂'s own values") {
  // Large queries and 1-bit keys: logit shifts of 4 to hundreds of nats, so p̂ / p falls
  // below fp32's resolution (p + (p̂ - p) would be rounding noise): both forms rank p̂
  // itself (attn_phat_by_exp, the large-shift form), and agree row for row.
  const Recording rec = test::random_recording(4, 2, 200, 64, 31, 12.0f);
  const Plan plan = uniform_plan(rec, "int1-asym-g64", "int2-asym-g64");
  SimOptions opt;
  opt.topk = 8;
  const auto [ref, fast] = check_against_reference(rec, plan, opt);
  int64_t by_exp = 0, large = 0;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    INFO("row " << i << ": head " << ref.rows[i].q_head << " t " << ref.rows[i].position);
    CHECK(fast.rows[i].topk_overlap == ref.rows[i].topk_overlap);
    by_exp += attn_phat_by_exp(ref.rows[i].logit_err_max) && !attn_large_shift(ref.rows[i].logit_err_max);
    large += attn_large_shift(ref.rows[i].logit_err_max);
  }
  CHECK(by_exp > 10);
  CHECK(large > 10);
}

TEST_CASE("fast path: large-shift rows where p̂ stays p take p̂ - p as the reference's fp64 difference") {
  // Queries' channel 0 = -12 and one outlier key (token 10, channel 0 = 10017): p ≈ 0
  // on it, and keep-bf16 stores it 31 off (bf16's spacing there is 64), a Δs of 46.5
  // nats. Its rows take the large-shift form while p̂ stays p within ~1e-6 (KL ~1e-6):
  // p̂ - p must be the fp64 difference, rounded once (as the reference and the CUDA
  // twin); float(p̂) - float(p) is rounding noise of p's size, which moved such rows'
  // out_err2 by up to 3e-4 relative.
  const int64_t T = 64, d = 64;
  Recording rec = test::random_recording(4, 2, T, d, 5, 2.0f);
  for (LayerTensors& L : rec.layers) {
    for (int64_t h = 0; h < rec.q_heads; ++h)
      for (int64_t t = 0; t < T; ++t) L.query.data[static_cast<size_t>((h * T + t) * d)] = -12.0f;
    for (int64_t g = 0; g < rec.kv_heads; ++g) L.key.data[static_cast<size_t>((g * T + 10) * d)] = 10017.0f;
  }
  const Plan plan = uniform_plan(rec, "keep-bf16", "keep-fp32");
  SimOptions opt;
  opt.topk = 8;
  const auto [ref, fast] = check_against_reference(rec, plan, opt);
  REQUIRE(fast.rows.size() == ref.rows.size());
  int64_t large = 0;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    const AttentionRow &a = ref.rows[i], &b = fast.rows[i];
    if (!attn_large_shift(a.logit_err_max)) continue;
    INFO("row " << i << ": layer " << a.layer << " head " << a.q_head << " t " << a.position);
    ++large;
    CHECK(a.kl < 1e-4);  // p̂ ≈ p: the case where float(p̂) - float(p) is noise
    CHECK(b.out_err2 == doctest::Approx(a.out_err2).epsilon(1e-6));
  }
  CHECK(large == 2 * 4 * (T - 10));  // every row that sees token 10, both layers
}

TEST_CASE("fast path: estimated logits (QJL keys), sink heads and attribution regions") {
  const Recording rec = test::random_recording(4, 2, 96, 64, 21);
  check_against_reference(rec, uniform_plan(rec, "qjl-m128", "int4-asym-g32"), SimOptions{});
  Plan sink = uniform_plan(rec, "int2-asym-g32", "int2-asym-g32");
  for (Kind k : {Kind::Key, Kind::Value}) {
    UnitPlan& u = sink.unit(1, 0, k);
    u.segments = {Segment{0, rec.tokens, make_format("keep-fp16"), SegmentRole::SinkHead}};
  }
  UnitPlan& keys = sink.unit(0, 1, Kind::Key);
  keys.segments = {Segment{0, 4, make_format("keep-fp16"), SegmentRole::SinkToken},
                   Segment{4, rec.tokens, make_format("int2-asym-g32"), SegmentRole::Allocated}};
  check_against_reference(rec, sink, SimOptions{});
  using Part = ErrorRegion::Part;
  for (ErrorRegion region : {ErrorRegion{Part::SinkHeads}, ErrorRegion{Part::SinkTokens}, ErrorRegion{Part::Rest},
                             ErrorRegion{Part::Tokens, 10, 50}}) {
    SimOptions opt;
    opt.region = &region;
    check_against_reference(rec, sink, opt);
    check_against_reference(rec, uniform_plan(rec, "qjl-m64", "int4-asym-g32"), opt);
  }
}

TEST_CASE("fast path: the bundled gpt2-bytes recording, every position") {
  RecordingSpec spec;
  spec.path = test::data_dir() / "records" / "gpt2-bytes-record.safetensors";
  spec.max_tokens = 256;
  const Recording rec = load_recording(spec);
  for (const char* f : {"int4-asym-g32", "int2-asym-ch32", "int8-sym-g32"}) {
    INFO("format " << f);
    check_against_reference(rec, uniform_plan(rec, f, f), SimOptions{});
  }
}

TEST_CASE("the exact-pass cache changes no bit, and is used only for the options it was built for") {
  const Recording rec = test::random_recording(4, 2, 130, 32, 7);
  SimOptions opt;
  opt.row_block = 24;
  check_cache_changes_nothing(rec, uniform_plan(rec, "int3-asym-g16", "int2-sym-g32"), opt);
  check_cache_changes_nothing(rec, windowed_plan(rec, RecentWindow::Mode::Chunked, false, 9, 21), opt);
  opt.positions = {3, 50, 51, 129};
  check_cache_changes_nothing(rec, uniform_plan(rec, "qjl-m64", "int4-asym-g32"), opt);

  const ExactAttentionCache cache(rec, opt, size_t(1) << 30);
  CHECK(cache.head(1, 3, opt) != nullptr);
  SimOptions other = opt;
  other.topk = 4;
  CHECK(cache.head(1, 3, other) == nullptr);
  other = opt;
  other.positions = {3, 50};
  CHECK(cache.head(1, 3, other) == nullptr);
  // A budget for two heads caches two of the eight; the rest are computed per call.
  const ExactAttentionCache small(rec, opt, 2 * (cache.bytes() / 8));
  CHECK(small.heads_cached() == 2);
  CHECK(small.head(0, 1, opt) != nullptr);
  CHECK(small.head(0, 2, opt) == nullptr);
}
