// Helpers of the GPU tests: where the bundled data is, and the llm.c-style comparison
// of GPU results with the CPU reference (atol + rtol·|ref|, naming the worst mismatch).
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "sim/formats/format.h"
#include "sim/metrics/error_stats.h"
#include "sim/metrics/metric_table.h"

namespace kvb::test {

// A test format the CPU has and the GPU has not: x̂ = 2x.
class CpuOnlyFormat final : public Format {
 public:
  std::string name() const override { return "cpu-only-double"; }
  uint64_t storage_bits(int64_t t, int64_t d) const override { return static_cast<uint64_t>(t * d); }
  void roundtrip(ConstMatView x, MatView out, const SpanInfo&) const override {
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) out.row(r)[c] = 2 * x.row(r)[c];
  }
  double nominal_bits() const override { return 1; }
};

// data/ of the repository: $KVB_DATA_DIR when set (the GPU machine runs the binaries
// away from the build tree), else the source tree's.
inline std::filesystem::path gpu_data_dir() {
  if (const char* env = std::getenv("KVB_DATA_DIR")) return env;
  return KVB_TEST_DATA_DIR;
}

// The repository (configs/): $KVB_SOURCE_DIR when set, else the source tree.
inline std::filesystem::path gpu_source_dir() {
  if (const char* env = std::getenv("KVB_SOURCE_DIR")) return env;
  return KVB_TEST_SOURCE_DIR;
}

// Every tensor- and attention-level metric agrees: |gpu - cpu| <= atol + rtol·|cpu|
// (equal infinities agree). Prints each metric's relative difference and names the
// worst one; returns it.
struct MetricAgreement {
  double worst_rel = 0;       // max over metrics of |gpu - cpu| / max(|cpu|, tiny)
  std::string worst_metric;
};

inline constexpr double kMetricRtol = 1e-5;
inline constexpr double kMetricAtol = 1e-12;

inline MetricAgreement check_metrics_agree(const ErrorStats& cpu, const ErrorStats& gpu, const std::string& label) {
  MetricAgreement agree;
  REQUIRE_MESSAGE(cpu.rows.size() == gpu.rows.size(), label << ": row counts differ");
  CHECK_MESSAGE(cpu.logit_pairs == gpu.logit_pairs, label << ": logit pair counts differ");
  // Rows in the same order, and every value of a row finite on both sides or on neither.
  for (size_t i = 0; i < cpu.rows.size(); ++i) {
    const AttentionRow &a = cpu.rows[i], &b = gpu.rows[i];
    bool same_row = true;
    for (const AttentionRowId& id : kAttentionRowIds) {
      if (a.*id.member == b.*id.member) continue;
      FAIL_CHECK(label << ": row " << i << " has " << id.name << " " << b.*id.member << " on the GPU, "
                       << a.*id.member << " on the CPU");
      same_row = false;
    }
    if (!same_row) break;
    for (const AttentionRowValue& v : kAttentionRowValues)
      CHECK_MESSAGE(std::isfinite(a.*v.member) == std::isfinite(b.*v.member),
                    label << ": row " << i << " (layer " << a.layer << ", q_head " << a.q_head << ", position "
                          << a.position << ") " << v.name << " is " << a.*v.member << " on the CPU, " << b.*v.member
                          << " on the GPU");
  }
  for (const MetricDef& m : metric_table()) {
    // Model-level metrics need a forward pass: neither simulator measures them (NaN).
    if (!m.compute || m.level == MetricLevel::Model) continue;
    const double c = m.compute(cpu), g = m.compute(gpu);
    const bool same_inf = std::isinf(c) && std::isinf(g) && (c > 0) == (g > 0);
    const double diff = same_inf ? 0.0 : std::fabs(g - c);
    const double rel = diff / std::max(std::fabs(c), 1e-300);
    if (diff > 0 && rel > agree.worst_rel) {
      agree.worst_rel = rel;
      agree.worst_metric = m.name;
    }
    CHECK_MESSAGE(diff <= kMetricAtol + kMetricRtol * std::fabs(c),
                  label << ": " << m.name << " cpu " << c << " gpu " << g << " (relative " << rel << ")");
  }
  MESSAGE(label << ": worst metric " << (agree.worst_metric.empty() ? "(all identical)" : agree.worst_metric)
                << " relative difference " << agree.worst_rel);
  return agree;
}

}  // namespace kvb::test
