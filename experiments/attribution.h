// Error-budget attribution: which layers, heads and token regions a point's
// attention error comes from (written to attribution.csv and concentration.csv).
//
// What is attributed are additive per-row errors (AdditiveError,
// sim/metrics/metric_table.h: sums over the evaluated rows (layer, query head,
// position), so shares add up exactly); any additive metric of the metric table can
// be, chosen by a config's attribution.metrics (AttributionSpec, experiments/experiment.h).
// By default two:
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
#include "sim/metrics/metric_table.h"
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

// The errors attributed unless told otherwise: kl (attn_kl_mean's) and out_err2
// (attn_out_rel_fro's), in that order.
const std::vector<const AdditiveError*>& default_attributed_errors();

// One sum per attributed error, in the order of Attribution::errors.
using ErrorSums = std::vector<double>;
// Σ over the rows of `stats` of each error.
ErrorSums error_sums(const ErrorStats& stats,
                     const std::vector<const AdditiveError*>& errors = default_attributed_errors());

struct Attribution {
  std::vector<const AdditiveError*> errors = default_attributed_errors();  // what every ErrorSums holds
  int64_t layers = 0, q_heads = 0;
  ErrorSums total;
  std::vector<ErrorSums> head;  // [layer * q_heads + q_head]
  struct Region {
    std::string partition, name;
    ErrorSums error;  // error with only this region quantized (interaction: the rest)
  };
  std::vector<Region> regions;  // per partition: its parts, then "interaction"
};

// From the point's full statistics and one statistics per region (aligned with
// `regions`), for each of `errors`. A plan without protections gets the protection
// partition's "rest" = the total error.
Attribution attribute(const ErrorStats& full, const std::vector<AttributionRegion>& regions,
                      const std::vector<ErrorStats>& region_stats, int64_t layers, int64_t q_heads,
                      const std::vector<const AdditiveError*>& errors = default_attributed_errors());

// Share of `part` in `total` (0 when the total is 0).
double error_share(double part, double total);

// CSV rows (no header) for one point; `key` must already be CSV-quoted.
// attribution.csv columns:
//   id,key,metric,scope,name,error,share   (metric: the error's name, AdditiveError::name;
//                                          scope: layer, head, region partition)
// concentration.csv columns: id,key,metric,rank,head,head_fraction,error_share
std::string attribution_rows(size_t id, const std::string& key, const Attribution& a);
std::string concentration_rows(size_t id, const std::string& key, const Attribution& a);
inline constexpr const char* kAttributionHeader = "id,key,metric,scope,name,error,share\n";
inline constexpr const char* kConcentrationHeader = "id,key,metric,rank,head,head_fraction,error_share\n";

}  // namespace kvb
