// Writers for fp32 tensors and raw byte dumps: NumPy .npy (format 1.0, '<f4', C order)
// and safetensors (F32, optional __metadata__). Files are written to a temporary name
// beside the target and renamed, so a failed write never leaves a truncated file.
// Errors are kvb::Error naming the file.
//
// These are the fp32 shorthands of the general writers in sim/io/tensor_writer.h
// (every dtype, several tensors) and sim/io/atomic_file.h, which do the work.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kvb {

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
