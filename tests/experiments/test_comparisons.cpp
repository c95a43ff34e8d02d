// Paired comparisons against a baseline (experiments/comparisons.*), on constructed
// points: extrapolated memory is marked in comparisons.csv and on the console, and
// points with too few blocks are "not comparable".
#include <sstream>

#include "experiments/comparisons.h"
#include "experiments/config.h"
#include "test_util.h"

using namespace kvb;

namespace {

// Two strategies, the second the baseline; memory on bpe_target at 32768 tokens.
ExperimentSpec spec_of(const std::string& x) {
  const std::string text =
      "name = \"cmp\"\n[data.synthetic]\nlayers = 1\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\ntokens = 96\n"
      "[[strategy]]\nname = \"kivi\"\npreset = \"kivi-2\"\n"
      "[[strategy]]\nname = \"flat\"\ntype = \"uniform\"\nformat = \"int2-asym-g32\"\n"
      "[metrics]\nreport = [\"attn_kl_mean\"]\nbaseline = \"flat\"\n[output]\nplots = false\nx = \"" + x + "\"\n";
  return parse_experiment(ConfigDoc::parse(text, "test.toml"));
}

// A finished point measured at 96 tokens over `blocks` blocks of positions, its KL
// `kl` in every block; `extrapolated`: its bpe_target describes another make-up.
PointResult point(size_t id, double bpe, double bpe_target, bool extrapolated, double kl, size_t blocks) {
  PointResult r;
  r.id = id;
  r.ok = true;
  r.bpe = bpe;
  r.bpe_target = bpe_target;
  r.measured_tokens = r.sized_for_tokens = 96;
  r.target_extrapolated = extrapolated;
  r.metrics = {kl};
  r.standard_errors = {NAN};
  r.intervals = {Interval{NAN, NAN}};
  BlockSums sums;
  for (size_t b = 0; b < blocks; ++b) {
    sums.num.push_back(kl * (1 + 0.1 * static_cast<double>(b)));
    sums.den.push_back(1);
  }
  r.block_sums = {sums};
  return r;
}

// The CSV's rows as field lists (no field here holds a comma).
std::vector<std::vector<std::string>> rows_of(const std::string& csv) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
    out.push_back(fields);
  }
  return out;
}

std::string field(const std::vector<std::vector<std::string>>& rows, size_t row, const std::string& name) {
  for (size_t c = 0; c < rows[0].size(); ++c)
    if (rows[0][c] == name) return rows.at(row).at(c);
  FAIL("no column " << name);
  return "";
}

bool has(const std::string& text, const std::string& part) {
  INFO(text);
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("comparisons mark extrapolated memory on output.x, in the CSV and on the console") {
  const ExperimentSpec spec = spec_of("bpe_target");
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(points.size() == 2);
  // kivi (id 0) is extrapolated at 32K on bpe_target; the flat baseline (id 1) is not.
  const std::vector<PointResult> results = {point(0, 6.25, 3.05, true, 0.02, 16), point(1, 3, 3, false, 0.03, 16)};
  const std::vector<Comparison> comparisons = compare_with_baseline(spec, points, results);
  REQUIRE(comparisons.size() == 1);
  CHECK(comparisons[0].extrapolated);
  CHECK_FALSE(comparisons[0].baseline_extrapolated);
  CHECK(comparisons[0].verdict == "better");
  const auto rows = rows_of(comparisons_csv(points, comparisons));
  REQUIRE(rows.size() == 2);
  CHECK(field(rows, 1, "extrapolated") == "true");
  CHECK(field(rows, 1, "baseline_extrapolated") == "false");
  CHECK(field(rows, 1, "memory") == "3.05");
  const std::string console = comparisons_console(spec, points, comparisons);
  CHECK(has(console, "kivi (extrapolated) vs flat (bpe_target 3.05 vs 3"));
  CHECK(has(console, "  extrapolated: memory at target_context 32768 tokens, error measured on 96 (docs/methods.md §1)"));

  // On bpe (the recorded context) nothing is extrapolated: no mark, no note.
  const ExperimentSpec at_bpe = spec_of("bpe");
  const std::vector<Comparison> measured = compare_with_baseline(at_bpe, points, results);
  REQUIRE(measured.size() == 1);
  CHECK_FALSE(measured[0].extrapolated);
  CHECK(field(rows_of(comparisons_csv(points, measured)), 1, "extrapolated") == "false");
  CHECK_FALSE(has(comparisons_console(at_bpe, points, measured), "extrapolated"));
}

TEST_CASE("comparisons over fewer than kMinIntervalUnits blocks are not comparable") {
  const ExperimentSpec spec = spec_of("bpe");
  const std::vector<SweepPoint> points = expand_sweep(spec);
  // KL 0.02 against 0.03 in every block: "better" over 5 blocks, nothing over 4 or 1.
  for (size_t blocks : {size_t{1}, size_t{4}, size_t{5}}) {
    INFO(blocks, " blocks");
    const std::vector<Comparison> c = compare_with_baseline(
        spec, points, {point(0, 6.25, 3.05, true, 0.02, blocks), point(1, 3, 3, false, 0.03, blocks)});
    REQUIRE(c.size() == 1);
    CHECK(c[0].verdict == (blocks >= 5 ? "better" : "not comparable"));
    const auto rows = rows_of(comparisons_csv(points, c));
    CHECK((field(rows, 1, "difference_lo") == "nan") == (blocks < 5));
    CHECK(field(rows, 1, "difference") != "nan");  // the measured difference stays
  }
}
