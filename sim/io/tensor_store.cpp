// TensorStore::open (format dispatch) and the pieces the stores share.
#include "sim/io/tensor_store.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/input_file.h"
#include "sim/io/store_common.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr const char* kHfIndexName = "model.safetensors.index.json";

enum class SniffedFormat { Npy, Zip, Safetensors, Unknown };

// For a file whose name says nothing: the NumPy magic, a zip local header, or a
// safetensors header (8-byte length, then a JSON object).
SniffedFormat sniff_format(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  in.read(head, sizeof head);
  if (in.gcount() >= 6 && std::memcmp(head, "\x93NUMPY", 6) == 0) return SniffedFormat::Npy;
  if (in.gcount() >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return SniffedFormat::Zip;
  if (in.gcount() == 9 && head[8] == '{') return SniffedFormat::Safetensors;
  return SniffedFormat::Unknown;
}

}  // namespace

std::string nearest_names_hint(const std::string& name, const std::vector<std::string>& names) {
  if (names.empty()) return "; the file holds no tensors";
  std::string hint = did_you_mean(name, names);
  // The five names nearest by edit distance, so a wrong pattern shows what exists.
  std::vector<std::pair<size_t, std::string>> ranked;
  for (const std::string& n : names) ranked.emplace_back(edit_distance(name, n), n);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> nearest;
  for (size_t i = 0; i < ranked.size() && i < 5; ++i) nearest.push_back("'" + ranked[i].second + "'");
  return hint + "; nearest names: " + join(nearest, ", ") + " (" + std::to_string(names.size()) + " tensors)";
}

void throw_missing_tensor(const std::string& where, const std::string& name, const std::vector<std::string>& names) {
  fail(where, "no tensor '" + name + "'" + nearest_names_hint(name, names));
}

void require_integer_dtype(const TensorInfo& info) {
  if (dtype_is_float(info.dtype))
    fail(info.file, "tensor '" + info.name + "' has float dtype " + dtype_name(info.dtype) +
                        "; expected an integer dtype (I32, I64, U8, I8, I16, BOOL)");
}

std::vector<TensorInfo> IndexedTensorStore::list() const {
  std::vector<TensorInfo> out;
  out.reserve(infos_.size());
  for (const auto& [name, inf] : infos_) out.push_back(inf);
  return out;
}

const TensorInfo& IndexedTensorStore::info(const std::string& name) const {
  const auto it = infos_.find(name);
  if (it == infos_.end()) throw_missing_tensor(path_.string(), name, names());
  return it->second;
}

std::vector<std::string> IndexedTensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(infos_.size());
  for (const auto& kv : infos_) out.push_back(kv.first);
  return out;
}

void TensorStore::read_raw(const std::string& name, void*) const {
  throw Error(path().string() + ": tensor '" + name + "' cannot be read as stored bytes from this file type " +
              "(safetensors only)");
}

void TensorStore::read_raw_rows(const std::string& name, int64_t, int64_t, void*) const {
  throw Error(path().string() + ": tensor '" + name + "' cannot be read by rows from this file type " +
              "(safetensors only)");
}

std::unique_ptr<TensorStore> TensorStore::open(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(path.string(), "no such file or directory");
  require_regular_file(path, "a tensor file", true);
  if (fs::is_directory(st)) {
    if (fs::exists(path / kHfIndexName)) return open_sharded_safetensors(path / kHfIndexName);
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.path().extension() == ".npy") return open_npy_directory(path);
    fail(path.string(), std::string("directory holds neither ") + kHfIndexName + " nor *.npy files");
  }
  const std::string name = path.filename().string();
  if (ends_with(name, ".safetensors.index.json")) return open_sharded_safetensors(path);
  if (ends_with(name, ".safetensors")) return open_safetensors(path);
  if (ends_with(name, ".npy")) return open_npy_file(path);
  if (ends_with(name, ".npz")) return open_npz(path);
  switch (sniff_format(path)) {
    case SniffedFormat::Npy: return open_npy_file(path);
    case SniffedFormat::Zip: return open_npz(path);
    case SniffedFormat::Safetensors: return open_safetensors(path);
    case SniffedFormat::Unknown: break;
  }
  fail(path.string(),
       "unknown tensor file type (by name and by content); expected .safetensors, .safetensors.index.json, "
       ".npy, .npz or a directory of .npy files");
}

}  // namespace kvb
