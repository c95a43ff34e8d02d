// Helpers of the GPU tests: where the bundled data is, and the llm.c-style comparison
// of GPU results with the CPU reference (atol + rtol·|ref|, naming the worst mismatch):
// the run's metrics, and each row's kl, out_err2 and top-k overlap.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
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

// Per row (the aggregates above can hide one wrong row among thousands): kl and
// out_err2 within kRowRtol of the CPU's plus a floor; top-k overlaps equal but for
// kRowTopkMismatchShare of the rows (near-tied probabilities may rank differently
// after last-bit differences of p; such rows are counted and reported).
//  - kRowRtol: the GPU follows the CPU's fast path, whose rows agree with the fp64
//    reference within ~5e-7 (tests/test_attention_fast.cpp); 1e-4 leaves room for the
//    different summation orders of the partial sums and GEMMs.
//  - kRowKlAtol (nats): the large-shift form's KL is a difference of logit-sized terms,
//    (m̂ + log ẑ) - (m + log z) - Σ p Δs, each rounded at 2^-52 of logits up to a few
//    hundred nats (~1e-13 absolute), summed in different orders on the two sides; 1e-11
//    nats is ten times that, and ~1e-4 of keep-fp16's mean row KL (~8e-8 on a
//    random recording with these queries' scale).
//  - kRowOutErr2Floor: relative to the row's ||o||²: an output error below 1e-6 of |o|
//    (out_err2 < 1e-12 ||o||², about 17 times fp32's own rounding of o) decides nothing,
//    and there the GEMMs' rounding is a large part of Δo (keep-fp16's rows are >= 2.5e-8
//    ||o||² in these tests, where the relative bound applies).
inline constexpr double kRowRtol = 1e-4;
inline constexpr double kRowKlAtol = 1e-11;
inline constexpr double kRowOutErr2Floor = 1e-12;
inline constexpr double kRowTopkMismatchShare = 0.01;

// The per-row comparison of check_metrics_agree: rows already matched by identity.
inline void check_rows_agree(const ErrorStats& cpu, const ErrorStats& gpu, const std::string& label) {
  int64_t topk_differ = 0, value_differ = 0;
  double worst_kl = 0, worst_out = 0;  // relative differences, for the report
  auto within = [](double c, double g, double atol) {
    if (std::isinf(c) || std::isinf(g) || std::isnan(c) || std::isnan(g)) return true;  // checked by finiteness
    return std::fabs(g - c) <= atol + kRowRtol * std::fabs(c);
  };
  for (size_t i = 0; i < cpu.rows.size(); ++i) {
    const AttentionRow &a = cpu.rows[i], &b = gpu.rows[i];
    if (b.topk_overlap != a.topk_overlap) {
      ++topk_differ;
      if (topk_differ <= 5)
        MESSAGE(label << ": row " << i << " (layer " << a.layer << ", q_head " << a.q_head << ", position "
                      << a.position << ") top-k overlap " << b.topk_overlap << " on the GPU, " << a.topk_overlap
                      << " on the CPU");
    }
    const double out_atol = kRowOutErr2Floor * std::fabs(static_cast<double>(a.out_norm2));
    if (std::isfinite(a.kl) && a.kl != 0)
      worst_kl = std::max(worst_kl, std::fabs(static_cast<double>(b.kl) - a.kl) / std::fabs(a.kl));
    if (std::isfinite(a.out_err2) && a.out_err2 != 0)
      worst_out = std::max(worst_out, std::fabs(static_cast<double>(b.out_err2) - a.out_err2) / std::fabs(a.out_err2));
    if (within(a.kl, b.kl, kRowKlAtol) && within(a.out_err2, b.out_err2, out_atol)) continue;
    if (++value_differ <= 10)
      FAIL_CHECK(label << ": row " << i << " (layer " << a.layer << ", q_head " << a.q_head << ", position "
                       << a.position << "): kl cpu " << a.kl << " gpu " << b.kl << ", out_err2 cpu " << a.out_err2
                       << " gpu " << b.out_err2 << " (out_norm2 " << a.out_norm2 << ")");
  }
  CHECK_MESSAGE(value_differ == 0, label << ": " << value_differ << " of " << cpu.rows.size()
                                         << " rows differ in kl or out_err2 (first 10 above)");
  const auto allowed = static_cast<int64_t>(kRowTopkMismatchShare * static_cast<double>(cpu.rows.size()));
  CHECK_MESSAGE(topk_differ <= allowed, label << ": " << topk_differ << " of " << cpu.rows.size()
                                              << " rows differ in top-k overlap (at most " << allowed
                                              << " allowed)");
  MESSAGE(label << ": per row: worst relative kl difference " << worst_kl << ", out_err2 " << worst_out << "; "
                << topk_differ << " of " << cpu.rows.size() << " rows' top-k overlaps differ");
}

inline MetricAgreement check_metrics_agree(const ErrorStats& cpu, const ErrorStats& gpu, const std::string& label) {
  MetricAgreement agree;
  REQUIRE_MESSAGE(cpu.rows.size() == gpu.rows.size(), label << ": row counts differ");
  CHECK_MESSAGE(cpu.logit_pairs == gpu.logit_pairs, label << ": logit pair counts differ");
  // Rows in the same order, and every value of a row finite on both sides or on neither.
  bool rows_match = true;
  for (size_t i = 0; i < cpu.rows.size(); ++i) {
    const AttentionRow &a = cpu.rows[i], &b = gpu.rows[i];
    bool same_row = true;
    for (const AttentionRowId& id : kAttentionRowIds) {
      if (a.*id.member == b.*id.member) continue;
      FAIL_CHECK(label << ": row " << i << " has " << id.name << " " << b.*id.member << " on the GPU, "
                       << a.*id.member << " on the CPU");
      same_row = false;
    }
    if (!same_row) {
      rows_match = false;
      break;
    }
    for (const AttentionRowValue& v : kAttentionRowValues)
      CHECK_MESSAGE(std::isfinite(a.*v.member) == std::isfinite(b.*v.member),
                    label << ": row " << i << " (layer " << a.layer << ", q_head " << a.q_head << ", position "
                          << a.position << ") " << v.name << " is " << a.*v.member << " on the CPU, " << b.*v.member
                          << " on the GPU");
  }
  if (rows_match) check_rows_agree(cpu, gpu, label);
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
