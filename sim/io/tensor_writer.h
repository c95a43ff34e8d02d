// Writers for the formats the stores read: safetensors (many named tensors plus string
// metadata) and NumPy .npy (one array, format 1.0). Element types F32, F16, BF16 from
// fp32 values, I32, I64 from int64 values. Files are written atomically (temporary
// file + rename, sim/io/atomic_file.h), so a crash never leaves a truncated file.
//
// A TensorToWrite is a view: the values stay owned by the caller until the write
// returns.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/core/tensor.h"
#include "sim/io/tensor_store.h"

namespace kvb {

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;       // row-major
  DType dtype = DType::F32;         // stored type: F32, F16, BF16, I32 or I64
  const float* floats = nullptr;    // numel values when dtype is F32/F16/BF16
  const int64_t* ints = nullptr;    // numel values when dtype is I32/I64

  // A float tensor stored as `dtype` (F32, F16 or BF16).
  static TensorToWrite of_floats(std::string name, std::vector<int64_t> shape, const float* values,
                                 DType dtype = DType::F32);
  static TensorToWrite of_tensor(std::string name, const Tensor& t, DType dtype = DType::F32);
  // An integer tensor stored as I32 (values must fit) or I64.
  static TensorToWrite of_ints(std::string name, std::vector<int64_t> shape, const int64_t* values,
                               DType dtype = DType::I64);
};

// "F32"/"f32"/"float32", "F16"/"fp16"/"float16", "BF16"/"bfloat16" -> DType; throws
// kvb::ConfigError naming `where` otherwise. For command-line options.
DType parse_float_dtype(const std::string& text, const std::string& where);

// One safetensors file: names must be unique and non-empty (not "__metadata__");
// tensors are laid out in the order given, 8-byte aligned header as the format's
// reference writer does. Errors name the file and the tensor.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// One .npy file holding `tensor` (its name is not stored).
void write_npy(const std::filesystem::path& path, const TensorToWrite& tensor);

// By extension: .safetensors writes every tensor; .npy needs exactly one tensor.
void write_tensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                   const std::map<std::string, std::string>& metadata = {});

// What a streamed file's header says of one tensor before any of its values is known.
struct TensorLayout {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  DType dtype = DType::F32;    // F32, F16, BF16 (values given as floats), I32 or I64 (as int64)
};

// A .safetensors or .npy file written piece by piece, for tensors too large to hold at
// once (the exact logits [T, vocab] of a long text, written one window of rows at a
// time): the header (every tensor's name, dtype and shape) is fixed when it is opened,
// then each tensor's values follow in the order given, in as many append calls as
// wanted (an append never spans two tensors). The bytes are those write_tensors writes
// for the same tensors (it writes through this class), and the file is as atomic: it
// appears at `path` on commit(), which requires every value; destroyed without
// commit(), the writer leaves nothing behind. Errors name the file and the tensor.
enum class TensorFileFormat { ByExtension, Safetensors, Npy };
class TensorFileStream {
 public:
  // .safetensors (any number of tensors, `metadata` stored) or .npy (exactly one
  // tensor, no metadata): by the extension as write_tensors goes (another is a
  // kvb::ConfigError), or the format given whatever the file is named.
  TensorFileStream(const std::filesystem::path& path, std::vector<TensorLayout> tensors,
                   const std::map<std::string, std::string>& metadata = {},
                   TensorFileFormat format = TensorFileFormat::ByExtension);
  ~TensorFileStream();
  TensorFileStream(const TensorFileStream&) = delete;
  TensorFileStream& operator=(const TensorFileStream&) = delete;

  // The next `count` values of the tensor being written (a float dtype: append_floats;
  // I32 or I64: append_ints; append_zeros either).
  void append_floats(const float* values, int64_t count);
  void append_ints(const int64_t* values, int64_t count);
  void append_zeros(int64_t count);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// fp32 shorthands of the writers above, and a raw byte dump (atomic too).
// shape outermost first (empty = a 0-d scalar); data holds product(shape) floats.
void write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data);

struct NamedTensorF32 {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
void write_safetensors_f32(const std::filesystem::path& path, const std::vector<NamedTensorF32>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

void write_bytes(const std::filesystem::path& path, const void* data, size_t size);

}  // namespace kvb
