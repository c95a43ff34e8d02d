// Pieces shared by the concrete tensor stores. Internal to sim/io.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/io/tensor_store.h"

namespace kvb {

// " (did you mean 'x'?); nearest names: 'a', 'b', 'c' (N tensors)": what to append to a
// message about a name (or pattern instance) that is not among `names`.
std::string nearest_names_hint(const std::string& name, const std::vector<std::string>& names);

// Throws kvb::Error: "<where>: no tensor 'name' (did you mean 'x'?); nearest names: a, b, c
// (N tensors)". `names` are all tensor names of the store.
[[noreturn]] void throw_missing_tensor(const std::string& where, const std::string& name,
                                       const std::vector<std::string>& names);

// Throws kvb::Error unless the tensor has an integer dtype (read_i64 rejects floats).
void require_integer_dtype(const TensorInfo& info);

// A store whose tensor list is known when it is opened (one safetensors file, NumPy
// files): list / contains / info over a name-sorted map.
class IndexedTensorStore : public TensorStore {
 public:
  const std::filesystem::path& path() const override { return path_; }
  std::vector<TensorInfo> list() const override;
  bool contains(const std::string& name) const override { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const override;

 protected:
  explicit IndexedTensorStore(std::filesystem::path p) : path_(std::move(p)) {}
  std::vector<std::string> names() const;

  std::filesystem::path path_;
  std::map<std::string, TensorInfo> infos_;
};

// Concrete stores, selected by TensorStore::open.
std::unique_ptr<TensorStore> open_safetensors(const std::filesystem::path& file);
std::unique_ptr<TensorStore> open_sharded_safetensors(const std::filesystem::path& index_file);
std::unique_ptr<TensorStore> open_npy_file(const std::filesystem::path& file);
std::unique_ptr<TensorStore> open_npy_directory(const std::filesystem::path& dir);
std::unique_ptr<TensorStore> open_npz(const std::filesystem::path& file);

}  // namespace kvb
