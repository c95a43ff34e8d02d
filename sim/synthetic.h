// Seeded synthetic recordings whose attention has controlled, measurable structure.
//
// The same spec and seed give the same tensors bit for bit on every run and for any
// thread count (own RNG and normal transform, no std:: distributions). Every control below is a property of the attention computed from the
// generated queries and keys (causal softmax(q·kᵀ/√d)), and tests/test_synthetic.cpp
// measures each one.
#pragma once
#include <cstdint>

#include "sim/recording.h"

namespace kvb {

struct SyntheticSpec {
  uint64_t seed = 0;
  int64_t layers = 2;
  int64_t q_heads = 8;
  int64_t kv_heads = 8;   // q_heads must be a multiple
  int64_t head_dim = 64;  // even (RoPE pairs)
  int64_t tokens = 256;

  // Per-head mean Shannon attention entropy (bits, mean over query positions) of the
  // non-sink heads is spread evenly over [entropy_mean - spread/2, entropy_mean + spread/2]
  // (clamped to what the causal prefix allows), assigned to heads in a seeded order.
  double entropy_mean = 4.0;
  double entropy_spread = 3.0;

  // Attention sinks: the first sink_tokens positions receive, in each sink head,
  // sink_mass of the attention on average over query positions. sink_heads heads per
  // layer (the lowest-entropy slots) are sink heads; 0 disables sinks.
  int64_t sink_tokens = 1;
  int64_t sink_heads = 0;
  double sink_mass = 0.6;

  // Recency: a positional score bonus of `recency` nats at distance 0 decaying over
  // about recency_scale tokens (sum of rotary cosines), in every head. 0 disables.
  double recency = 0.0;
  double recency_scale = 32.0;

  // Key outlier channels: this many channels per KV head scaled by outlier_scale.
  int64_t outlier_channels = 0;
  double outlier_scale = 8.0;

  // RoPE: when true, keys/queries are post-RoPE with this theta and the recording
  // also carries key_pre_rope (the same keys before rotation, positions 0..T-1).
  bool rope = false;
  double rope_theta = 10000.0;

  // Two phases: tokens [0, boundary) and [boundary, T) where boundary =
  // round(phase_fraction * T). Keys within each phase have mean pairwise cosine
  // (research definition, sim/metrics/redundancy.h) rho_first / rho_second.
  // phase_fraction = 1 gives a single phase with rho_first.
  double phase_fraction = 1.0;
  double rho_first = 0.3;
  double rho_second = 0.3;
  // Token ids are seeded bytes 0..255; the first token of the second phase is
  // phase_marker (e.g. a "</think>" id) when phase_fraction < 1.
  int64_t phase_marker = 257;

  double key_scale = 1.0;    // typical key norm / sqrt(head_dim)
  double value_scale = 1.0;  // values ~ N(0, value_scale^2)
};

// Validates the spec (clear kvb::ConfigError naming the field) and generates.
Recording generate_synthetic(const SyntheticSpec& spec);

}  // namespace kvb
