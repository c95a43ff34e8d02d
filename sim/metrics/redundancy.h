// Key redundancy ρ: the mean pairwise cosine similarity of keys within a token range.
//
// This is the statistic behind the TAQG phase bound (docs: methods.md §3, "TAQG bound"):
// per phase, ρ = mean over pairs i < j of cos(k_i, k_j). The research definition, which
// key_rho() implements, is:
//   1. take the post-RoPE keys of one layer, [kv_heads, T, d] (Recording::LayerTensors::key);
//   2. average them over the KV heads: k̄_t = (1/kv_heads) Σ_g key[g, t, :], one [d] row
//      per token t in [t0, t1);
//   3. unit-normalise every row and take the mean over pairs i < j of r̂_i · r̂_j;
//   4. average that over a subset of layers.
// key_rho_head() is the per-head variant (no averaging over KV heads), which is what a
// per-head allocator would read; the two differ because averaging heads cancels their
// independent parts and keeps what they share.
//
// Cost: O(n·d) per layer via Σ_{i<j} r̂_i·r̂_j = (‖Σ_i r̂_i‖² − n) / 2, in double precision.
// Range: ρ ∈ [−1/(n−1), 1]; ρ = 1 when all keys point the same way, ≈ 0 for independent
// random directions in high dimension.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/recording.h"

namespace kvb {

// Mean pairwise cosine of the rows of a [n, d] row-major matrix: rows unit-normalised,
// mean over the n(n−1)/2 pairs i < j. Rows of zero norm have no direction and are left
// out (n counts the others). Returns NaN when fewer than two rows remain.
double mean_pairwise_cosine(const float* rows, int64_t n, int64_t d);
double mean_pairwise_cosine(const double* rows, int64_t n, int64_t d);

// Which keys of the recording ρ is measured on.
enum class KeyFrame {
  Recorded,  // LayerTensors::key: post-RoPE when the model uses RoPE (the research choice)
  PreRope,   // LayerTensors::key_pre_rope (throws if the recording has none)
};

// Research ρ of one layer (li indexes rec.layers) over tokens [t0, t1): keys averaged
// across KV heads, then mean_pairwise_cosine. Throws kvb::Error on a bad layer index or
// token range (t0 < t1 <= T, at least two tokens).
double key_rho_layer(const Recording& rec, int64_t li, int64_t t0, int64_t t1,
                     KeyFrame frame = KeyFrame::Recorded);

// Research ρ of a phase: key_rho_layer averaged over `layers` (indices into rec.layers;
// empty = every layer), as mean_of_layer_rhos combines them.
double key_rho(const Recording& rec, int64_t t0, int64_t t1, const std::vector<int64_t>& layers = {},
               KeyFrame frame = KeyFrame::Recorded);

// The tokens and layers of one key_rho: tokens [t0, t1), `layers` indices into
// rec.layers (empty = every layer; an index given twice counts twice).
struct KeyRhoRange {
  int64_t t0 = 0, t1 = 0;
  std::vector<int64_t> layers;
  bool operator==(const KeyRhoRange&) const = default;
};

// The layers key_rho averages over for `range` (range.layers, or every layer in order
// when empty). Throws the kvb::Error key_rho throws for a bad token range or layer
// index (the token range checked first), without reading any tensor.
std::vector<int64_t> key_rho_layers(const Recording& rec, const KeyRhoRange& range);

// key_rho from its per-layer values (key_rho_layer of each of key_rho_layers, in that
// order): their sum in that order over their count. key_rho is exactly this, so ρ
// combined from per-layer values computed one layer at a time (RecordingStats::key_rho
// on a streamed recording) has the held computation's bits.
double mean_of_layer_rhos(const std::vector<double>& layer_rhos);

// Per-head variant: mean pairwise cosine of one KV head's keys over [t0, t1).
double key_rho_head(const Recording& rec, int64_t li, int64_t kv_head, int64_t t0, int64_t t1,
                    KeyFrame frame = KeyFrame::Recorded);

}  // namespace kvb
