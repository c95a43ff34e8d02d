// Seeded synthetic recordings whose attention has controlled, measurable structure.
//
// The same spec and seed give the same tensors bit for bit on every run and for any
// thread count (own RNG and normal transform, no std:: distributions). Every control
// below is a property of the attention computed from the generated queries and keys
// (causal softmax(q·kᵀ/√d), sim/metrics/attention.h) or of the keys themselves
// (sim/metrics/redundancy.h), and tests/test_synthetic.cpp measures each one.
//
// How (details in sim/synthetic.cpp): head_dim is cut into rotary pairs (channel i with
// i + d/2) with separate jobs, so that every score decomposes exactly into
//   s(t, j) = content(t, j) + recency(t − j) + sink bonus(j):
//   - content pairs: key = D·(√w·A·u_phase + √(1−w)·key_scale·z_j), u a seeded direction
//     shared by a phase's keys (its weight w sets ρ), z_j Gaussian, D the outlier scaling;
//     the query is β·(direction of a seeded target key's own part z before D, plus
//     noise), so a head "looks for" one earlier token and β sets how sharply;
//   - positional pairs: rotating key/query components whose dot product is
//     recency·mean_p cos(ω_p (t − j)) (with RoPE: constant pre-RoPE vectors in the RoPE
//     pairs of matching frequency, exactly as RoPE models learn it);
//   - one sink pair (the slowest): sink keys carry a large component there, sink heads'
//     queries a matching one of calibrated size.
// Then w (per layer and phase) is solved so the research ρ hits its target, β per head so
// the head's mean entropy hits its target, the sink gain so sink heads put sink_mass on
// the sink tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sim/core/error.h"
#include "sim/recording.h"

namespace kvb {

struct SyntheticSpec {
  uint64_t seed = 0;
  int64_t layers = 2;
  int64_t q_heads = 8;
  int64_t kv_heads = 8;   // q_heads must be a multiple (GQA: q head h reads kv head h / (q_heads/kv_heads))
  int64_t head_dim = 64;  // must be even with RoPE; odd sizes leave the last channel as content
  int64_t tokens = 256;

  // Per-head mean Shannon attention entropy (bits, mean over query positions) of the
  // non-sink heads is spread evenly over [entropy_mean - spread/2, entropy_mean + spread/2]
  // (clamped to what the causal prefix allows), assigned to heads in a seeded order.
  double entropy_mean = 4.0;
  double entropy_spread = 3.0;

  // Attention sinks: the first sink_tokens positions receive, in each sink head,
  // sink_mass of the attention on average over query positions. sink_heads heads per
  // layer (the lowest-entropy slots) are sink heads; 0 disables sinks. sink_layers > 0
  // restricts sink heads to that many layers (a seeded choice), e.g. sink_heads = 1,
  // sink_layers = 3 gives 3 sink heads among 144 as reported for GPT-2; 0 = every layer.
  int64_t sink_tokens = 1;
  int64_t sink_heads = 0;
  double sink_mass = 0.6;
  int64_t sink_layers = 0;

  // Recency: a positional score bonus of `recency` nats at distance 0 decaying over
  // about recency_scale tokens (mean of rotary cosines), in every head. 0 disables.
  double recency = 0.0;
  double recency_scale = 32.0;

  // Key outlier channels: this many channels per KV head scaled by outlier_scale
  // (pre-RoPE keys: the channels are fixed there, as in real models).
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

  // Query positions the entropy and sink calibration measure (spread evenly over
  // 1..T-1, as spread_positions()). More is more exact and slower.
  int64_t calibration_queries = 512;
};

// How the channels of every head are used (indices into head_dim). Rotary pair p is
// channels p and p + head_dim/2.
struct SyntheticChannels {
  std::vector<int64_t> positional;  // recency pairs' channels (empty when recency = 0)
  std::vector<double> positional_freq;  // radians per token of each positional pair
  std::vector<int64_t> sink;        // the sink pair's channels (empty without sink heads)
  std::vector<int64_t> content;     // every other channel
  // Content channels that carry the shared phase direction u: all of them without RoPE;
  // with RoPE the slowest-rotating quarter (a direction RoPE barely turns, so keys can
  // stay similar across a long phase).
  std::vector<int64_t> shared;
};

struct SyntheticHeadReport {
  bool sink = false;
  double entropy_target = 0;      // bits, after clamping (sink heads: their content slot)
  double entropy_calibrated = 0;  // bits, mean over the calibration positions
  double sink_mass_calibrated = 0;  // mean mass on the sink tokens, calibration positions
  double content_gain = 0;        // β: query content norm
  double sink_gain = 0;           // query component on the sink channel (0 for non-sink heads)
};

struct SyntheticLayerReport {
  double shared_weight_first = 0, shared_weight_second = 0;  // w per phase
  double rho_first = 0, rho_second = 0;  // research ρ of this layer after generation
  std::vector<std::vector<int64_t>> outlier_channels;  // [kv_heads] -> sorted channels
  std::vector<SyntheticHeadReport> heads;              // [q_heads]
};

// What the generator aimed for and reached; `warnings` lists every target it had to
// clamp (unreachable entropy, ρ or sink mass), naming layer, head and spec field.
struct SyntheticReport {
  SyntheticChannels channels;
  int64_t phase_boundary = 0;  // first token of the second phase (= T for one phase)
  std::vector<SyntheticLayerReport> layers;
  std::vector<std::string> warnings;
};

// A bad field of a SyntheticSpec: what() is "synthetic spec: FIELD: why".
class SyntheticSpecError : public ConfigError {
 public:
  SyntheticSpecError(std::string field, std::string why)
      : ConfigError("synthetic spec: " + field + ": " + why), field(std::move(field)), why(std::move(why)) {}
  std::string field, why;
};

// What a run reads of a synthetic recording; the generator keeps nothing else. Every
// kept value is bit-identical to the full recording's (the generator computes the same
// tensors and drops the rest as it goes).
struct SyntheticKeep {
  // Query positions kept (sorted, distinct, each < tokens; LayerTensors::query_positions):
  // e.g. a run's calibration and evaluated positions. Empty = every position.
  std::vector<int64_t> query_positions;
  bool key_pre_rope = true;  // with rope = true: keep the keys before rotation
};

// Throws SyntheticSpecError naming the first bad field and why. The memory check counts
// one layer's keys, values and (with rope) pre-RoPE keys (what a streamed run holds at
// most); generate_synthetic counts every layer's with the kept queries and pre-RoPE keys
// only when kept (SyntheticKeep), SyntheticLayers one layer's with them.
void validate_synthetic_spec(const SyntheticSpec& spec);

// Validates the spec and generates. When `report` is given it receives the calibration
// details; the recording's metadata carries the spec, the measured ρ per phase and the
// warnings either way.
//
// Memory: the recording (what `keep` keeps; the next layer's keys and values are
// allocated while a layer is generated) plus one layer's working set, whatever the
// thread count (layers are generated one after another, each in parallel inside): while
// the keys' shared weight is solved, the head-averaged key parts in fp64 (8 [T, head_dim]
// fp32's worth: 4/kv_heads of a layer's keys and values); then the calibration scores
// (kv_heads + at most enough query heads at once for the larger of one layer's keys and
// values' worth and 1 GiB, at least one, of calibration_queries x T fp32 each).
Recording generate_synthetic(const SyntheticSpec& spec, SyntheticReport* report = nullptr,
                             const SyntheticKeep& keep = {});

// The same recording, report and metadata bit for bit from the plain generator that
// generate_synthetic replaced: layers in parallel, each holding every KV head's key parts
// and query targets and every position's query, about 25 kB per token per layer in
// flight on Llama-3-8B's head shape. Kept as the reference the bounded-memory generator
// is tested against (tests/test_synthetic.cpp).
Recording generate_synthetic_reference(const SyntheticSpec& spec, SyntheticReport* report = nullptr,
                                       const SyntheticKeep& keep = {});

// The bounded-memory generator one layer at a time, for a run that streams its layers
// (experiments/streaming.h): layer l is a pure function of the spec, `keep` and l, so it
// can be generated when a pass needs it and dropped after. skeleton() + generate_into()
// of every layer + finish() give generate_synthetic's recording, metadata and report bit
// for bit (tests/experiments/test_streaming.cpp).
class SyntheticLayers {
 public:
  // Validates as generate_synthetic does (SyntheticSpecError, or kvb::Error for a bad
  // kept position).
  explicit SyntheticLayers(const SyntheticSpec& spec, const SyntheticKeep& keep = {});
  ~SyntheticLayers();
  SyntheticLayers(const SyntheticLayers&) = delete;
  SyntheticLayers& operator=(const SyntheticLayers&) = delete;

  int64_t layers() const;
  // The recording without its layers' tensors: every other field as generate_synthetic
  // sets it, `layers` one entry per layer holding its kept query positions only, and
  // the spec's metadata (what is measured on the layers comes with finish()).
  Recording skeleton() const;
  // Generates layer l into rec.layers[l] (rec: skeleton()'s), one layer's working set
  // as generate_synthetic's. The first time, notes what finish() reports of the layer
  // (measured ρ, warnings).
  void generate_into(Recording& rec, int64_t l);
  // Adds the metadata measured on the layers (ρ per phase, warnings) to rec.metadata and
  // gives the report. Throws kvb::Error when some layer was never generated.
  void finish(Recording& rec, SyntheticReport* report = nullptr) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvb
