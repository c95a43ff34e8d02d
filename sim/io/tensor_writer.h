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
