// Named tensors read from files: safetensors (single or Hugging Face sharded),
// NumPy .npy (a file, or a directory of them) and .npz.
//
// Files are memory-mapped; read_f32() converts the one requested tensor straight from
// the mapping into a fresh fp32 buffer (the only copy made). Every structural problem
// (truncated file, header offsets out of range, unknown dtype, bad JSON) is a
// kvb::Error that names the file and, where it applies, the tensor.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/core/tensor.h"

namespace kvb {

// Element types found in tensor files. Only the float types can be read as
// recordings; integer types are read for token ids.
enum class DType { F32, F16, BF16, F64, I32, I64, U8, I8, I16, BOOL };

const char* dtype_name(DType d);   // safetensors spelling: "F32", "BF16", ...
int dtype_bytes(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string file;  // which file holds it (a shard, an .npy, or the .npz)
};

class TensorStore {
 public:
  virtual ~TensorStore() = default;

  // Opens by extension / content:
  //  - *.safetensors                     one safetensors file
  //  - *.safetensors.index.json, or a directory holding model.safetensors.index.json
  //                                      a Hugging Face sharded checkpoint
  //  - *.npy                             one array, named after the file stem
  //  - *.npz                             NumPy archive (stored or deflated members)
  //  - a directory of *.npy files        one tensor per file, named after the stem
  static std::unique_ptr<TensorStore> open(const std::filesystem::path& path);

  virtual const std::filesystem::path& path() const = 0;
  // Sorted by name.
  virtual std::vector<TensorInfo> list() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual const TensorInfo& info(const std::string& name) const = 0;  // throws if absent
  // The tensor converted to fp32 (F32/F16/BF16/F64 and integer types).
  virtual Tensor read_f32(const std::string& name) const = 0;
  // Integer tensors (I32/I64/U8/...) as int64; float tensors are rejected.
  virtual std::vector<int64_t> read_i64(const std::string& name) const = 0;
  // The tensor's bytes exactly as stored (little-endian, row-major): numel ×
  // dtype_bytes(info.dtype) bytes into dst. Safetensors only (model checkpoints keep
  // their 16-bit weights 16-bit this way); other stores throw a kvb::Error.
  virtual void read_raw(const std::string& name, void* dst) const;
  // Rows [first, first + count) of the tensor's outermost dimension, bytes as stored:
  // count × (numel / shape[0]) × dtype_bytes(info.dtype) bytes into dst, read from the
  // file without touching the rest of the tensor (a tensor too large to hold is read a
  // slice at a time). Throws kvb::Error naming the file and tensor when the tensor has
  // no dimension or the rows are out of range; safetensors only, like read_raw.
  virtual void read_raw_rows(const std::string& name, int64_t first, int64_t count, void* dst) const;
  // safetensors' __metadata__ (empty for NumPy files).
  virtual std::map<std::string, std::string> metadata() const { return {}; }
};

}  // namespace kvb
