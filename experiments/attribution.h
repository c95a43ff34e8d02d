// Error-budget attribution: which layers, heads and token regions a point's
// attention error comes from (written to attribution.csv and concentration.csv).
//
// Two errors are attributed, both sums over the evaluated rows (layer, query head,
// position), so shares add up exactly:
//   kl        Σ KL(p ‖ p̂)     (attn_kl_mean × rows)
//   out_err2  Σ ‖o − ô‖²      (the numerator of attn_out_rel_fro²)
// Layers and heads: at attention level a row only reads its own KV head, so the
// error of the rows of layer l / query head h is exactly the error that quantizing
// that layer's / head's cache causes; shares are these sums over the total.
// Token regions: "the error with only that region quantized" (the simulator keeps
// the region's reconstruction error and sees everything else exact, see
// ErrorRegion in sim/simulator.h), over the total error. Two partitions:
//   protection: sink_heads, sink_tokens, window, rest (only the parts the plan has;
//               a plan without protections is 100% rest without a simulation);
//   phase:      first_phase, second_phase (when the plan or recording has a boundary).
// Regions interact (errors of different tokens meet in one softmax), so each
// partition also gets an "interaction" row, 1 − Σ its shares, and the shares of a
// partition sum to exactly 1.
// Concentration: query heads sorted by error, worst first; the share of the total
// error the worst x% of heads carry.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/metrics/error_stats.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/simulator.h"

namespace kvb {

struct AttributionRegion {
  std::string partition;  // "protection" or "phase"
  std::string name;       // "sink_heads", "window", "first_phase", ...
  ErrorRegion region;
};

// The regions of a plan that need their own simulation (empty when no partition
// has two or more parts).
std::vector<AttributionRegion> attribution_regions(const Plan& plan, const Recording& rec);

struct ErrorPair {
  double kl = 0, out_err2 = 0;
};
ErrorPair error_sums(const ErrorStats& stats);

struct Attribution {
  int64_t layers = 0, q_heads = 0;
  ErrorPair total;
  std::vector<ErrorPair> head;  // [layer * q_heads + q_head]
  struct Region {
    std::string partition, name;
    ErrorPair error;  // error with only this region quantized (interaction: the rest)
  };
  std::vector<Region> regions;  // per partition: its parts, then "interaction"
};

// From the point's full statistics and one statistics per region (aligned with
// `regions`). A plan without protections gets the protection partition's "rest" =
// the total error.
Attribution attribute(const ErrorStats& full, const std::vector<AttributionRegion>& regions,
                      const std::vector<ErrorStats>& region_stats, int64_t layers, int64_t q_heads);

// Share of `part` in `total` (0 when the total is 0).
double error_share(double part, double total);

// CSV rows (no header) for one point; `key` must already be CSV-quoted.
// attribution.csv columns:
//   id,key,metric,scope,name,error,share   (scope: layer, head, region partition)
// concentration.csv columns: id,key,metric,rank,head,head_fraction,error_share
std::string attribution_rows(size_t id, const std::string& key, const Attribution& a);
std::string concentration_rows(size_t id, const std::string& key, const Attribution& a);
inline constexpr const char* kAttributionHeader = "id,key,metric,scope,name,error,share\n";
inline constexpr const char* kConcentrationHeader = "id,key,metric,rank,head,head_fraction,error_share\n";

}  // namespace kvb
