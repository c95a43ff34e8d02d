// Shards: one sweep split into N parts that run anywhere (a Slurm job array, several
// machines) and merge back into exactly the result of one run (experiments/merge.h).
//
// Every point belongs to exactly one shard, and which one depends only on the config:
// points are dealt out by estimated cost (point_cost), the most expensive first, each
// to the shard with the least estimated work so far (ties: the lower shard index;
// equal costs: the lower point id). Points keep their global ids in every shard.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/sweep.h"
#include "sim/recording.h"

namespace kvb {

struct Shard {
  size_t index = 0;  // 0 .. count-1
  size_t count = 1;  // 1 = the whole sweep
  bool whole() const { return count == 1; }
  std::string text() const { return std::to_string(index) + "/" + std::to_string(count); }  // "2/4"
};

// Parses --shard: "I/N" (0 <= I < N) or "auto", which reads the Slurm job array's
// SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT and SLURM_ARRAY_TASK_MIN through `env`
// (std::getenv by default): shard (ID - MIN) of COUNT. Throws kvb::ConfigError naming
// `option`, e.g. for "auto" outside a job array or an array with a step (--array=0-7:2).
Shard parse_shard(const std::string& text, const std::string& option,
                  const std::function<const char*(const char*)>& env = nullptr);

// The estimated cost of a point, in full simulations of the recording (all layers):
//   1    measuring it (tensor/attention metrics, or attribution's shares), else 0
//   + 2  token-region attribution when [attribution] selects it with regions = true
//        (one more simulation per region; plans typically have two or three)
//   + 3  the model task (a forward pass and the continuations) for model-level metrics
//   + 2  type "optimal", whose plan measures per-unit distortion before the point runs
//   + 0.05 any plan
// An estimate from the config alone (the data is not loaded yet): good enough to
// balance shards, not a prediction of seconds.
double point_cost(const ExperimentSpec& spec, const SweepPoint& point);

// The points of `shard`, in id order (a subset of `points`, ids unchanged).
std::vector<SweepPoint> shard_points(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                     const Shard& shard);

// What must agree between shards merged into one result and between a run and its
// resumption (written to manifest.json):
// The config's hash (FNV-1a 64, hex) over config.toml's text without the keys that
// do not change results: threads, output.dir and output.plots. --set overrides,
// --budget queries and --backend are part of it.
std::string sweep_config_hash(const ExperimentSpec& spec);
// The keys in which two resolved configs (config.toml texts) differ among those the hash
// reads, each as "strategy[0].vars.bits ([2, 3] there, [2, 4] now)", in the first one's
// key order (then the second's new keys); empty when they agree or one is not TOML.
std::vector<std::string> config_differences(const std::string& then_toml, const std::string& now_toml);
// The first 5 of them joined by "; " (", and N more"); "" when there are none.
std::string config_differences_text(const std::string& then_toml, const std::string& now_toml);
// config_differences_text of a results folder's config.toml ("there") against
// `now_toml`; "" when the folder has none.
std::string folder_config_differences(const std::filesystem::path& dir, const std::string& now_toml);
// The data's identity: a hash (FNV-1a 64 over 8-byte words, hex) of everything the
// points see: every layer's tensors, token ids, positions, the RoPE and the phase
// boundary, with the shapes; for a model source, the exact model's recording.
std::string recording_identity(const Recording& rec);
// recording_identity one layer at a time, for a recording whose layers are streamed
// (sim/layer_stream.h): add_layer(rec.layers[l]) for l = 0, 1, ... in order, then
// finish(rec): the same hash.
class RecordingIdentity {
 public:
  explicit RecordingIdentity(const Recording& rec);
  void add_layer(const LayerTensors& layer);
  std::string finish(const Recording& rec) const;

 private:
  uint64_t h_;
};

}  // namespace kvb
