// Simulator: applies a Plan to a Recording on the CPU and measures the error it
// causes (methods.md §4, tensor and attention level).
//
// For each layer: every unit's K and V are reconstructed (quantized, then
// dequantized) segment by segment (sim/reconstruction.h); then, for each query head
// and each evaluated position t, the causal attention with the original and the
// reconstructed cache are compared: p = softmax(q·Kᵀ/√d), p̂ from K̂; o = p·V, ô = p̂·V̂.
// Score and output differences are computed directly (ΔS = Q·ΔKᵀ,
// Δo = p̂·ΔV + (p̂ - p)·V) so that tiny errors are not lost to cancellation.
//
// The sweep and the optimal allocator reach it as the CPU backend, CpuMeasurer
// (sim/measurer.h), the interface a CUDA or any other backend implements too.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "sim/core/error.h"
#include "sim/metrics/error_stats.h"
#include "sim/plan.h"
#include "sim/reconstruction.h"
#include "sim/recording.h"

namespace kvb {

// A part of the cache whose quantization error a simulation keeps, for error
// attribution: outside it every key and value is seen exact. Parts depend only on
// the token j and the version of it the query sees (stored or window), so keeping a
// part is zeroing the other rows of each unit's reconstruction error.
//   SinkHeads:  every token of units stored whole as sink heads;
//   SinkTokens: stored versions of sink-token segments;
//   Window:     window versions (relative to each query);
//   Rest:       stored versions of allocated segments;
//   Tokens:     tokens j in [begin, end), any version (e.g. one phase).
// SinkHeads, SinkTokens, Window and Rest partition every error a plan causes.
struct ErrorRegion {
  enum class Part { SinkHeads, SinkTokens, Window, Rest, Tokens };
  Part part = Part::Rest;
  int64_t begin = 0, end = 0;  // Part::Tokens only
};

class ExactAttentionCache;  // sim/exact_attention.h

struct SimOptions {
  int64_t topk = 8;                 // k of the top-k overlap
  std::vector<int64_t> positions;   // evaluated query positions, sorted; empty = all
  uint64_t seed = 0;                // handed to formats through SpanInfo
  int64_t row_block = 64;           // query rows per GEMM block (fewer key columns past the causal edge than 128)
  const ErrorRegion* region = nullptr;  // keep only this region's errors (attribution)
  // true: the plain fp64 measurement (sim/attention_error_reference.cpp), the
  // yardstick the fast fp32 path (the default) is tested against; both give the same
  // metrics within 1e-5 relative (tests/test_attention_fast.cpp).
  bool reference = false;
  // The run's exact pass (fast path only): used for the heads it holds when it was
  // built for these positions, row_block and topk; results are identical without it.
  const ExactAttentionCache* exact = nullptr;
  // When set, checked before each kStopCheckRowBlocks-th row block of every query head; once true the simulation throws SimulationStopped (a Ctrl-C of a sweep
  // then waits for at most that many row blocks per thread, not for whole layers).
  const std::atomic<bool>* stop = nullptr;
};

// Row blocks (SimOptions::row_block rows each) simulated between two looks at
// SimOptions::stop. Whole blocks, so the rows are computed exactly as without a stop.
inline constexpr int64_t kStopCheckRowBlocks = 4;

// Thrown by the simulation when SimOptions::stop became true: the layer was not finished.
class SimulationStopped : public Error {
 public:
  using Error::Error;
};

// Error of the query heads of one KV head (rows in (q_head, position) order). Only
// that KV head's K and V units of `plan` are read. Single-threaded, deterministic.
ErrorStats simulate_kv_head(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head,
                            const SimOptions& opt);

// Error of one layer (index into rec.layers). Single-threaded and deterministic.
ErrorStats simulate_layer(const Recording& rec, const Plan& plan, int64_t layer, const SimOptions& opt);

// All layers in order, merged.
ErrorStats simulate(const Recording& rec, const Plan& plan, const SimOptions& opt);

}  // namespace kvb
