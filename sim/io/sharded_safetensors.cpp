// A Hugging Face sharded checkpoint: model.safetensors.index.json holds
// {"metadata": {...}, "weight_map": {tensor name: shard file name}}, shard files
// beside it. Shards are opened (mapped, header parsed) the first time one of their
// tensors is asked for; list() opens them all.
#include <nlohmann/json.hpp>

#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "sim/core/error.h"
#include "sim/io/input_file.h"
#include "sim/io/json_file.h"
#include "sim/io/store_common.h"

namespace kvb {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class ShardedSafetensorsStore final : public TensorStore {
 public:
  explicit ShardedSafetensorsStore(const fs::path& index_file);

  const fs::path& path() const override { return index_file_; }
  std::vector<TensorInfo> list() const override;
  bool contains(const std::string& name) const override { return shard_of_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const override { return shard_holding(name).info(name); }
  Tensor read_f32(const std::string& name) const override { return shard_holding(name).read_f32(name); }
  std::vector<int64_t> read_i64(const std::string& name) const override {
    return shard_holding(name).read_i64(name);
  }
  void read_raw(const std::string& name, void* dst) const override { shard_holding(name).read_raw(name, dst); }
  void read_raw_rows(const std::string& name, int64_t first, int64_t count, void* dst) const override {
    shard_holding(name).read_raw_rows(name, first, count, dst);
  }
  // The index's "metadata" (numbers written as JSON text), not the shards' own.
  std::map<std::string, std::string> metadata() const override { return metadata_; }

 private:
  const TensorStore& shard_holding(const std::string& name) const;
  const TensorStore& shard(const std::string& shard_name) const;

  fs::path index_file_;
  std::map<std::string, std::string> shard_of_;  // tensor name -> shard file name
  std::map<std::string, std::string> metadata_;
  // Opened shards by file name; guarded so that concurrent readers may open them.
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::unique_ptr<TensorStore>> shards_;
};

ShardedSafetensorsStore::ShardedSafetensorsStore(const fs::path& index_file) : index_file_(index_file) {
  const std::string where = index_file.string();
  require_regular_file(index_file, "a sharded checkpoint index");
  std::ifstream in(index_file, std::ios::binary);
  if (!in) fail(where, "cannot open sharded checkpoint index");
  std::stringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = parse_json_checking_duplicates(text.str(), [&](const std::string& key, const std::string& parent) {
      if (parent == "weight_map") throw Error("duplicate tensor name '" + key + "' in the weight_map of " + where);
      fail(where, "duplicate key '" + key + "'" + (parent.empty() ? "" : " in '" + parent + "'") +
                      " in the sharded checkpoint index");
    });
  } catch (const json::exception& e) {
    fail(where, std::string("bad JSON in sharded checkpoint index: ") + e.what());
  }
  if (!index.is_object()) fail(where, "sharded checkpoint index must be a JSON object");
  const auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    fail(where, "sharded checkpoint index has no \"weight_map\" object (tensor name -> shard file)");
  std::set<std::string> shard_files;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) fail(where, "weight_map entry '" + name + "' must name a shard file");
    const fs::path shard_path(file.get<std::string>());
    if (shard_path.empty() || shard_path.has_parent_path() || shard_path.is_absolute() || shard_path == ".." ||
        shard_path == ".")
      fail(where, "weight_map entry '" + name + "' names shard '" + file.get<std::string>() +
                      "': a shard must be a file name in the index's directory");
    shard_of_[name] = file.get<std::string>();
    shard_files.insert(file.get<std::string>());
  }
  // Shards are opened lazily, but a missing one is reported now.
  for (const std::string& f : shard_files)
    if (!fs::exists(index_file.parent_path() / f))
      fail(where, "shard file '" + f + "' listed in weight_map does not exist in " +
                      index_file.parent_path().string());
  if (const auto md = index.find("metadata"); md != index.end() && md->is_object())
    for (const auto& [k, v] : md->items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
}

const TensorStore& ShardedSafetensorsStore::shard(const std::string& shard_name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shards_.find(shard_name);
  if (it == shards_.end())
    it = shards_.emplace(shard_name, open_safetensors(index_file_.parent_path() / shard_name)).first;
  return *it->second;
}

const TensorStore& ShardedSafetensorsStore::shard_holding(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    std::vector<std::string> names;
    for (const auto& kv : shard_of_) names.push_back(kv.first);
    throw_missing_tensor(index_file_.string(), name, names);
  }
  const TensorStore& s = shard(it->second);
  if (!s.contains(name))
    fail(s.path().string(), "weight_map in " + index_file_.filename().string() + " places tensor '" + name +
                                "' in this shard, but the shard does not hold it");
  return s;
}

std::vector<TensorInfo> ShardedSafetensorsStore::list() const {
  std::vector<TensorInfo> out;
  out.reserve(shard_of_.size());
  for (const auto& kv : shard_of_) out.push_back(info(kv.first));
  return out;
}

}  // namespace

std::unique_ptr<TensorStore> open_sharded_safetensors(const fs::path& index_file) {
  return std::make_unique<ShardedSafetensorsStore>(index_file);
}

}  // namespace kvb
