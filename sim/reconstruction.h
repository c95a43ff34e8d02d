// Cache reconstruction: what a Plan's formats make of one cache unit, shared by the
// recording simulator (sim/simulator.cpp), the model's quantized KV cache
// (sim/model/kv_cache.cpp) and `kvbudget quantize` (quantize_tensor).
//
// A unit is the [T, head_dim] keys or values of one (layer, KV head). Its formats see
// it through SpanInfo (sim/formats/format.h): unit_span() describes the unit from
// token 0 (identity, seed, RoPE context), span_from() the same unit some rows later,
// as each segment gets it. reconstruct_unit_versions() then builds every version a
// query may read (plan.h, row_versions): the stored version segment by segment, the
// window version, and the key segments whose logits come from an estimator (QJL).
// Every reconstruction is checked for values a format turned into Inf or NaN.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/tensor.h"
#include "sim/formats/format.h"
#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

// Where a cache's spans come from, as its formats learn it: a name for error
// messages and the RoPE context of its keys. The pointers must outlive the spans.
struct SpanSource {
  const char* name = "";                              // recording, model, or FILE:tensor
  bool rope_applied = false;                          // the keys are post-RoPE
  double rope_theta = 10000.0;
  const std::vector<float>* rope_inv_freq = nullptr;  // scaled inverse frequencies, or null / empty (theta's)
  const int64_t* positions = nullptr;                 // RoPE position of token j, or null (j itself)
};

// A recording's source: its name, RoPE and positions.
SpanSource span_source(const Recording& rec);

// What a format learns about unit (layer, kv_head, kind) from token 0: its identity and
// seed, the source's name and RoPE context, and for keys the unit's pre-RoPE keys
// [T, head_dim] from token 0 (row stride head_dim) when key_pre_rope is not null.
SpanInfo unit_span(const SpanSource& source, int64_t layer, int64_t kv_head, Kind kind, uint64_t seed,
                   const float* key_pre_rope = nullptr, int64_t head_dim = 0);
// The same for a unit of a recording (its pre-RoPE keys when recorded).
SpanInfo unit_span(const Recording& rec, int64_t layer, int64_t kv_head, Kind kind, uint64_t seed);

// The span of the same unit starting `offset` rows later: first_token, the pre-RoPE
// key pointer and the positions move along.
SpanInfo span_from(const SpanInfo& unit_span, int64_t offset);

// Thrown when a format turns finite keys or values into Inf or NaN (a value beyond its
// range): what() names the format, the count and the first element.
class NonFiniteReconstruction : public Error {
 public:
  using Error::Error;
};

// A key segment [begin, end) whose stored-version logits q·k come from its format's
// estimator (keys-only formats such as QJL) instead of decoded keys. The estimate
// replaces the decoded-key logits on columns [keep_begin, keep_end): the whole segment,
// unless the simulator's attribution region narrows it (ErrorRegion, simulator.h).
struct EstimatedKeys {
  int64_t begin = 0, end = 0;
  std::unique_ptr<ScoreEstimator> estimator;
  int64_t keep_begin = 0, keep_end = 0;
};

// Quantizes then dequantizes x [T, head_dim] (row-major) segment by segment as `unit`
// says, into out [T, head_dim]; each segment gets `unit_span` (the unit from token 0)
// shifted to its first token. Throws NonFiniteReconstruction when a format turns a
// finite value into Inf or NaN.
void reconstruct_unit(const UnitPlan& unit, const float* x, int64_t T, int64_t head_dim, const SpanInfo& unit_span,
                      float* out);

// The window version of a unit with an active window: every row of x [T, head_dim]
// through the window's format, into out [T, head_dim]; `unit_span` as for
// reconstruct_unit. Which (query, token) pairs read it, row_versions() says (plan.h).
void reconstruct_window(const UnitPlan& unit, const float* x, int64_t T, int64_t head_dim, const SpanInfo& unit_span,
                        float* out);

// Every version of a unit a query may read, from its exact values x [T, head_dim]:
//   stored [T, head_dim]  the segments' version (reconstruct_unit);
//   window [T, head_dim]  the window version, written only when unit.window.active()
//                         (may be null otherwise);
//   estimated             for a key unit, one entry per segment whose format has a
//                         score estimator, in segment order (replaces its contents).
// What the simulator and the model's KV cache both read.
void reconstruct_unit_versions(const UnitPlan& unit, const float* x, int64_t T, int64_t head_dim,
                               const SpanInfo& unit_span, float* stored, float* window,
                               std::vector<EstimatedKeys>& estimated);

// What Format::roundtrip_grown kept for a growing unit's segments fitted to their span
// and for its window (GrowthMemo), between calls of update_unit_versions.
struct UnitGrowthMemos {
  std::vector<std::pair<int64_t, GrowthMemo>> segments;  // (first token, memo) of each fitted segment
  GrowthMemo window;
};

// reconstruct_unit_versions for a unit that has grown (a decoding cache), reusing what
// an earlier call built. On entry `stored` holds the stored version that call built for
// `before` over the first T_before rows of the same x and unit_span, and `window` its
// window version when before's window was active; both have room for T rows. On return
// they hold the versions for `unit` over T rows, and `estimated` its estimated key
// segments: bit for bit what reconstruct_unit_versions gives. Only rows whose version
// may differ are re-quantized: from the first group that is not complete in both the
// old and the new segment (same first token and format) when the format splits at its
// groups (Format::splits_at_groups); for a format fitted to its span, only the rows the
// segment gained while its fit holds, else the whole segment (Format::roundtrip_grown);
// the whole segment when there was no such old segment; the window likewise.
// Estimators are rebuilt for every segment.
// `memos`: null, or what the format kept for each fitted segment and the window at the
// previous call on this unit (Format::roundtrip_grown), replaced by what it keeps now.
void update_unit_versions(const UnitPlan& before, int64_t T_before, const UnitPlan& unit, const float* x, int64_t T,
                          int64_t d, const SpanInfo& unit_span, float* stored, float* window,
                          std::vector<EstimatedKeys>& estimated, UnitGrowthMemos* memos = nullptr);

// About how many rows update_unit_versions re-quantizes for the same arguments (its
// segments' and window's rows, and the key rows a keys-only format's estimator is rebuilt
// from; a fitted format's whole segment, since whether its fit holds is known only
// then): what a caller decides threads by.
int64_t rows_to_update(const UnitPlan& before, int64_t T_before, const UnitPlan& unit, int64_t T);

// A tensor quantized on its own (`kvbudget quantize`): rows of its last dimension
// (head_dim), every dimension before it flattened into rows.
struct TensorQuantization {
  Tensor dequantized;     // the shape of the input
  BitWriter codes;        // every span's codes, one after the other (Format::encode)
  uint64_t storage_bits = 0;
  double err2 = 0, norm2 = 0, max_abs = 0;  // Σ (x̂ - x)², Σ x², max |x̂ - x| over finite outputs
  int64_t nonfinite = 0;  // dequantized values that are NaN or ±inf (finite input overflowed the format)
  int64_t clipped = 0;    // values clipped to the format's range (Format::clipped_values)

  // Inf / -inf when some output is not finite.
  double relative_mse() const;
  double snr_db() const;
};

// Quantizes x with format f in spans of rows_per_span rows (the last one possibly
// shorter): span s is unit (layer 0, kv_head s, kind) of `source`, so seeded formats
// use a different rotation per span. key_pre_rope: null, or the pre-RoPE keys shaped
// like x (the spans' rows then have positions 0 .. rows_per_span - 1). Throws
// ConfigError naming `source.name` when a span's shape does not suit the format.
TensorQuantization quantize_tensor(const Tensor& x, const Format& f, int64_t rows_per_span, Kind kind, uint64_t seed,
                                   const SpanSource& source, const Tensor* key_pre_rope = nullptr);

}  // namespace kvb
