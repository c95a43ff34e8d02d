// Pareto fronts and budget queries (experiments/frontier.*) on constructed points.
#include <algorithm>
#include <cmath>

#include "experiments/frontier.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

TEST_CASE("Pareto front keeps exactly the non-dominated points, cheapest first") {
  //                        0    1    2    3    4    5    6
  const std::vector<double> cost = {4.0, 2.0, 3.0, 3.0, 5.0, 2.5, 6.0};
  const std::vector<double> err = {0.1, 0.9, 0.3, 0.5, 0.1, 0.95, 0.05};
  // 1 (2.0, 0.9) cheapest; 5 dominated by 1; 2 beats 3 at equal cost; 0 (4, 0.1)
  // dominates 4 (5, 0.1); 6 is the most accurate.
  CHECK(pareto_front(cost, err, Better::Lower) == std::vector<size_t>{1, 2, 0, 6});
  // Higher-is-better metric (e.g. top-k overlap).
  const std::vector<double> overlap = {0.9, 0.5, 0.7, 0.8, 0.95, 0.4, 0.9};
  CHECK(pareto_front(cost, overlap, Better::Higher) == std::vector<size_t>{1, 3, 0, 4});
}

TEST_CASE("Pareto front: ties, NaN and brute-force agreement") {
  CHECK(pareto_front({1, 1, 1}, {0.5, 0.5, 0.5}, Better::Lower) == std::vector<size_t>{0});
  CHECK(pareto_front({1, 2}, {NAN, 0.1}, Better::Lower) == std::vector<size_t>{1});
  CHECK(pareto_front({}, {}, Better::Lower).empty());
  // Random clouds against the definition.
  const std::vector<float> a = test::random_normal(400, 3), b = test::random_normal(400, 4);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> c, e;
    for (size_t i = 0; i < 100; ++i) {
      c.push_back(std::round(a[trial * 100 + i] * 4) / 4);  // many equal costs
      e.push_back(b[trial * 100 + i]);
    }
    const std::vector<size_t> front = pareto_front(c, e, Better::Lower);
    for (size_t i = 0; i < c.size(); ++i) {
      bool dominated = false;
      for (size_t j = 0; j < c.size(); ++j)
        if (c[j] <= c[i] && e[j] <= e[i] && (c[j] < c[i] || e[j] < e[i])) dominated = true;
      const bool in_front = std::find(front.begin(), front.end(), i) != front.end();
      if (in_front) CHECK(!dominated);
      // A non-dominated point is on the front unless an identical earlier point is.
      if (!dominated && !in_front) {
        bool twin = false;
        for (size_t j : front) twin |= c[j] == c[i] && e[j] == e[i];
        CHECK(twin);
      }
    }
  }
}

TEST_CASE("budget queries: least memory meeting an error budget, least error within a memory budget") {
  FrontierInput in;
  in.bpe = {3.0, 4.0, 5.0, 8.0};
  in.bytes = {30, 40, 50, 80};
  in.bpe_target = in.bpe;
  in.bytes_target = in.bytes;
  in.metric_names = {"attn_kl_mean", "topk_overlap"};
  in.metric_values = {{1e-2, 2e-3, 5e-4, 1e-5}, {0.7, 0.8, 0.9, 0.99}};
  in.pareto_metrics = {"attn_kl_mean", "topk_overlap"};

  BudgetAnswer a = answer_budget(parse_budget_query("attn_kl_mean <= 1e-3", "test"), in);
  REQUIRE(a.picks.size() == 1);
  CHECK(a.picks[0].index == std::optional<size_t>(2));
  a = answer_budget(parse_budget_query("topk_overlap >= 0.8", "test"), in);
  CHECK(a.picks[0].index == std::optional<size_t>(1));
  a = answer_budget(parse_budget_query("attn_kl_mean <= 1e-9", "test"), in);
  CHECK(!a.picks[0].index);  // nothing qualifies
  a = answer_budget(parse_budget_query("bpe <= 4.5", "test"), in);
  REQUIRE(a.picks.size() == 2);
  CHECK(a.picks[0].index == std::optional<size_t>(1));
  CHECK(a.picks[1].index == std::optional<size_t>(1));
  a = answer_budget(parse_budget_query("bytes <= 29", "test"), in);
  CHECK(!a.picks[0].index);
}

TEST_CASE("budget queries minimize the memory column the experiment plots (output.x)") {
  // A windowed point: dearer than the flat ones at the recorded length, cheapest at the target.
  FrontierInput in;
  in.bpe = {3.0, 4.0, 6.25};
  in.bytes = {30, 40, 62.5};
  in.bpe_target = {3.0, 4.0, 3.05};
  in.bytes_target = {3000, 4000, 3050};
  in.metric_names = {"attn_kl_mean"};
  in.metric_values = {{1e-2, 2e-3, 1e-3}};
  in.pareto_metrics = {"attn_kl_mean"};
  const BudgetQuery error_budget = parse_budget_query("attn_kl_mean <= 5e-3", "test");
  CHECK(answer_budget(error_budget, in).picks[0].index == std::optional<size_t>(1));
  in.memory = "bpe_target";
  CHECK(answer_budget(error_budget, in).picks[0].index == std::optional<size_t>(2));
  // A memory budget reads its own column whatever output.x is.
  CHECK(answer_budget(parse_budget_query("bpe <= 5", "test"), in).picks[0].index == std::optional<size_t>(1));
  CHECK(answer_budget(parse_budget_query("bpe_target <= 3.5", "test"), in).picks[0].index == std::optional<size_t>(2));
  CHECK(&frontier_column(in, "bytes_target") == &in.bytes_target);
  CHECK_THROWS_AS(frontier_column(in, "topk_overlap"), ConfigError);
}

TEST_CASE("extrapolated: memory at a longer context than the error, per memory column") {
  PointResult flat, windowed, sized;
  for (PointResult* r : {&flat, &windowed, &sized}) r->measured_tokens = r->sized_for_tokens = 512;
  windowed.target_extrapolated = true;  // its make-up at the target differs from the measured cache's
  sized.sized_for_tokens = 32768;       // budget_context 32768
  for (const std::string& memory : memory_columns()) {
    CHECK(!extrapolated_on(flat, memory));
    CHECK(extrapolated_on(windowed, memory) == (memory == "bpe_target" || memory == "bytes_target"));
    CHECK(extrapolated_on(sized, memory));
  }
  CHECK(extrapolated_label(flat) == "no");
  CHECK(extrapolated_label(windowed) == "target_context");
  CHECK(extrapolated_label(sized) == "budget_context");
  sized.target_extrapolated = true;
  CHECK(extrapolated_label(sized) == "budget_context+target_context");
  CHECK(extrapolation_note(flat, "bpe_target", 32768).empty());
  CHECK(extrapolation_note(windowed, "bpe", 32768).empty());
  CHECK(extrapolation_note(windowed, "bpe_target", 32768) ==
        "memory at target_context 32768 tokens, error measured on 512");
  CHECK(extrapolation_note(sized, "bytes", 32768) ==
        "allocated for budget_context 32768 tokens, error measured on 512");
  CHECK(extrapolation_note(sized, "bytes_target", 65536) ==
        "allocated for budget_context 32768 tokens, memory at target_context 65536 tokens, error measured on 512");
}

TEST_CASE("budget query syntax errors are clear") {
  CHECK_THROWS_WITH_AS(parse_budget_query("attn_kl_mean = 3", "cfg:3"), doctest::Contains("should look like"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_budget_query("attn_kl_meen <= 3", "cfg:3"),
                       doctest::Contains("did you mean 'attn_kl_mean'"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_budget_query("topk_overlap <= 0.9", "cfg:3"), doctest::Contains("use >="), ConfigError);
  CHECK_THROWS_WITH_AS(parse_budget_query("bpe >= 3", "cfg:3"), doctest::Contains("upper bound"), ConfigError);
}
