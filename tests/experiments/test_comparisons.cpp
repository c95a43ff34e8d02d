// Paired comparisons against a baseline (experiments/comparisons.*), on constructed
// points: points with too few blocks are "not comparable".
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

}  // namespace

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
