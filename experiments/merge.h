// `kvbudget merge`: shard folders (kvbudget run --shard I/N) back into one results
// folder equal to a single run's (timing columns aside). The shards' results.jsonl
// (experiments/point_log.h) are read back and written by the same Report code a run
// uses: points.csv, errors.csv, attribution.csv, concentration.csv, pareto.csv,
// budgets.json, plots.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/sweep.h"

namespace kvb {

struct ShardFolder {
  std::filesystem::path dir;
  nlohmann::json manifest;
};

struct MergeInput {
  std::vector<ShardFolder> shards;
  std::vector<PointResult> results;  // every point of the sweep, by id
  std::vector<std::string> keys;     // results[i]'s point key as the shard wrote it
  std::vector<size_t> from;          // results[i]'s shard folder (index into shards)
  size_t sweep_points = 0;
};

// Manifest keys that must agree between the shards, and what a difference means.
struct MergeKey {
  const char* key;
  const char* meaning;
};
inline constexpr MergeKey kMergeKeys[] = {
    {"config_hash", "different configs or --set/--budget/--backend options"},
    {"seed", "different seeds"},
    {"data_identity", "different data"},
    {"git_commit", "different program versions"},
    {"kvbudget_version", "different program versions"},
    {"backend", "measured by different backends (use backend = \"cpu\" or \"cuda\" for sharded sweeps)"},
    {"sweep_points_total", "sweeps of different sizes"},
};

// Reads the folders' manifests and results.jsonl and checks that they are shards of
// one sweep: the kMergeKeys agree and every point is in exactly one folder. Throws
// kvb::Error listing every problem: each difference (naming both folders and the
// values), duplicated points (with their folders) and missing points (ids as ranges).
MergeInput read_shards(const std::vector<std::filesystem::path>& dirs);

// Throws kvb::Error when a result's key is not the sweep's point with its id (the
// folders' config.toml expands to other points than the shards measured).
void check_point_keys(const MergeInput& in, const std::vector<SweepPoint>& points);

// "3, 7-9, 12" for sorted ids.
std::string id_ranges(const std::vector<size_t>& ids);

}  // namespace kvb
