#include "sim/io/tensor_write.h"

#include "sim/io/atomic_file.h"
#include "sim/io/tensor_writer.h"

namespace kvb {

void write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data) {
  write_npy(path, TensorToWrite::of_floats(path.stem().string(), shape, data, DType::F32));
}

void write_safetensors_f32(const std::filesystem::path& path, const std::vector<NamedTensorF32>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> out;
  for (const NamedTensorF32& t : tensors) out.push_back(TensorToWrite::of_floats(t.name, t.shape, t.data, DType::F32));
  write_safetensors(path, out, metadata);
}

void write_bytes(const std::filesystem::path& path, const void* data, size_t size) {
  AtomicFileWriter out(path);
  out.write(data, size);
  out.commit();
}

}  // namespace kvb
