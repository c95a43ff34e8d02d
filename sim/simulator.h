// Simulator: applies a Plan to a Recording on the CPU and measures the error it
// causes (methods.md §4, tensor and attention level).
//
// For each layer: every unit's K and V are reconstructed (quantized, then
// dequantized) segment by segment; then, for each query head and each evaluated
// position t, the causal attention with the original and the reconstructed cache
// are compared: p = softmax(q·Kᵀ/√d), p̂ from K̂; o = p·V, ô = p̂·V̂.
// Score and output differences are computed directly (ΔS = Q·ΔKᵀ,
// Δo = p̂·ΔV + (p̂ - p)·V) so that tiny errors are not lost to cancellation.
// Key segments whose format has a score estimator (Format::score_estimator, e.g.
// QJL) take their logits from it instead: ΔS = estimate(q·k)/√d - q·k/√d; their
// decoded keys only enter the tensor-level key error.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/metrics/error_stats.h"
#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

struct SimOptions {
  int64_t topk = 8;                 // k of the top-k overlap
  std::vector<int64_t> positions;   // evaluated query positions, sorted; empty = all
  uint64_t seed = 0;                // handed to formats through SpanInfo
  int64_t row_block = 128;          // query rows per GEMM block
};

// What a format learns about the span of unit (layer, kv_head, kind) starting at token
// first_token: its identity and seed, and for keys the recording's RoPE context
// (pre-RoPE keys when recorded, positions, theta).
SpanInfo make_span_info(const Recording& rec, int64_t layer, int64_t kv_head, Kind kind, int64_t first_token,
                        uint64_t seed);

// The reconstructed [T, head_dim] matrix of one unit, row-major, into out.
void reconstruct_unit(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head, Kind kind,
                      const SimOptions& opt, float* out);

// Error of one layer (index into rec.layers). Single-threaded and deterministic.
ErrorStats simulate_layer(const Recording& rec, const Plan& plan, int64_t layer, const SimOptions& opt);

// All layers in order, merged.
ErrorStats simulate(const Recording& rec, const Plan& plan, const SimOptions& opt);

}  // namespace kvb
