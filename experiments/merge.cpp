#include "experiments/merge.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "experiments/point_log.h"
#include "experiments/run_state.h"
#include "experiments/shard.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

std::string id_ranges(const std::vector<size_t>& ids) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ids[i]) : std::to_string(ids[i]) + "-" + std::to_string(ids[j]));
    i = j + 1;
  }
  return join(parts, ", ");
}

namespace {

// "; the configs differ in seed (0 there, 1 now) (...)" ("there": `first`'s
// config.toml, "now": `other`'s); "" when none is found.
std::string changed_keys(const std::filesystem::path& first, const std::filesystem::path& other) {
  std::ifstream in(other / "config.toml");
  std::ostringstream now;
  if (in) now << in.rdbuf();
  const std::string keys = in ? folder_config_differences(first, now.str()) : "";
  return keys.empty() ? "" : "; the configs differ in " + keys + " (\"there\": " + first.string() + ")";
}

}  // namespace

MergeInput read_shards(const std::vector<std::filesystem::path>& dirs) {
  if (dirs.empty()) throw Error("no shard folders given");
  MergeInput in;
  std::vector<std::string> problems;
  std::vector<std::vector<PointLogEntry>> logs;
  for (const std::filesystem::path& dir : dirs) {
    ShardFolder f{dir, read_manifest(dir)};
    const std::filesystem::path log = dir / kPointLogFile;
    if (!std::filesystem::exists(log)) {
      if (f.manifest.contains("config_hash"))
        logs.emplace_back();  // a shard killed before its first point: its points are missing
      else
        throw Error(log.string() + ": missing: " + dir.string() +
                    " was written by a kvbudget without results.jsonl (rerun it to merge it)");
    } else {
      logs.push_back(read_point_log(log));
    }
    in.shards.push_back(std::move(f));
  }
  const ShardFolder& first = in.shards.front();
  for (size_t s = 1; s < in.shards.size(); ++s) {
    for (const MergeKey& k : kMergeKeys) {
      const nlohmann::json a = first.manifest.value(k.key, nlohmann::json()),
                           b = in.shards[s].manifest.value(k.key, nlohmann::json());
      if (a == b) continue;
      // A shard stopped before its data was identified holds no identity: unknown, not
      // different; --resume on that folder identifies it.
      if (std::string(k.key) == "data_identity" && (a.is_null() || b.is_null())) {
        const ShardFolder& unknown = a.is_null() ? first : in.shards[s];
        problems.push_back("data_identity unknown in " + unknown.dir.string() +
                           " (the shard stopped before its data was identified): finish it with kvbudget run "
                           "--resume " + unknown.dir.string() + ", then merge");
        continue;
      }
      problems.push_back(std::string(k.key) + " differs (" + k.meaning + "): " + b.dump() + " in " +
                         in.shards[s].dir.string() + ", " + a.dump() + " in " + first.dir.string() +
                         (std::string(k.key) == "config_hash" ? changed_keys(first.dir, in.shards[s].dir) : ""));
    }
    const Shard sa = manifest_shard(first.manifest), sb = manifest_shard(in.shards[s].manifest);
    if (sa.count != sb.count)
      problems.push_back("shard counts differ: " + sb.text() + " in " + in.shards[s].dir.string() + ", " + sa.text() +
                         " in " + first.dir.string());
  }
  in.sweep_points = first.manifest.value("sweep_points_total", first.manifest.value("points_total", size_t{0}));
  std::map<size_t, std::vector<size_t>> where;  // point id -> folders holding it
  std::map<size_t, std::pair<size_t, const PointLogEntry*>> chosen;
  for (size_t s = 0; s < logs.size(); ++s)
    for (const PointLogEntry& e : logs[s]) {
      if (e.result.id >= in.sweep_points) {
        problems.push_back(in.shards[s].dir.string() + "/" + kPointLogFile + ":" + std::to_string(e.line) +
                           ": point id " + std::to_string(e.result.id) + " is outside the sweep's " +
                           std::to_string(in.sweep_points) + " points");
        continue;
      }
      where[e.result.id].push_back(s);
      chosen[e.result.id] = {s, &e};
    }
  std::vector<size_t> missing;
  std::vector<std::string> duplicated;
  for (size_t id = 0; id < in.sweep_points; ++id) {
    const auto it = where.find(id);
    if (it == where.end()) {
      missing.push_back(id);
    } else if (it->second.size() > 1) {
      std::vector<std::string> folders;
      for (size_t s : it->second) folders.push_back(in.shards[s].dir.string());
      duplicated.push_back("point " + std::to_string(id) + " in " + join(folders, " and "));
    }
  }
  if (!duplicated.empty())
    problems.push_back(std::to_string(duplicated.size()) +
                       " point(s) in more than one folder: " + join(duplicated, "; "));
  if (!missing.empty())
    problems.push_back(std::to_string(missing.size()) + " of " + std::to_string(in.sweep_points) +
                       " point(s) in no folder (a shard not given, or unfinished: see kvbudget status): ids " +
                       id_ranges(missing));
  if (!problems.empty()) {
    std::string text = "the folders are not the complete shards of one sweep:";
    for (const std::string& p : problems) text += "\n  " + p;
    throw Error(text);
  }
  for (const auto& [id, pick] : chosen) {
    in.results.push_back(pick.second->result);
    in.keys.push_back(pick.second->key);
    in.from.push_back(pick.first);
  }
  return in;
}

void check_point_keys(const MergeInput& in, const std::vector<SweepPoint>& points) {
  if (points.size() != in.sweep_points)
    throw Error("the shards' config.toml expands to " + std::to_string(points.size()) +
                " points, their manifests say " + std::to_string(in.sweep_points));
  for (size_t i = 0; i < in.results.size(); ++i) {
    const size_t id = in.results[i].id;
    if (points[id].key != in.keys[i])
      throw Error(in.shards[in.from[i]].dir.string() + ": point " + std::to_string(id) + " is " + in.keys[i] +
                  ", but the config expands it to " + points[id].key);
  }
}

}  // namespace kvb
