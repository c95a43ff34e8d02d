#include "sim/io/tensor_write.h"

#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>
#include <fstream>

#include "sim/core/error.h"

namespace kvb {

namespace {

static_assert(std::endian::native == std::endian::little, "the writers emit the host's little-endian floats");

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Writes header + payload to path via a temporary file and a rename.
void write_parts(const std::filesystem::path& path, const std::string& header, const void* data, size_t size) {
  std::filesystem::path tmp = path;
  tmp += ".tmp.write";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path.string(), "cannot open for writing");
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    if (size) out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.flush();
    if (!out) fail(path.string(), "write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(path.string(), "cannot rename the temporary file into place");
  }
}

}  // namespace

void write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) fail(path.string(), "negative dimension in shape");
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  }
  dict += "), }";
  // magic (6) + version (2) + header length (2) + dict, padded with spaces and a final
  // newline to a multiple of 64 bytes (what NumPy writes).
  size_t total = 10 + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>((dict.size() >> 8) & 0xff);
  header += dict;
  write_parts(path, header, data, static_cast<size_t>(numel(shape)) * sizeof(float));
}

void write_safetensors_f32(const std::filesystem::path& path, const std::vector<NamedTensorF32>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensorF32& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail(path.string(), "invalid tensor name '" + t.name + "'");
    if (h.contains(t.name)) fail(path.string(), "duplicate tensor name '" + t.name + "'");
    const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * sizeof(float);
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string header(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(header.data(), &n, 8);
  header += json;
  std::vector<char> payload(offset);
  size_t at = 0;
  for (const NamedTensorF32& t : tensors) {
    const size_t bytes = static_cast<size_t>(numel(t.shape)) * sizeof(float);
    if (bytes) std::memcpy(payload.data() + at, t.data, bytes);
    at += bytes;
  }
  write_parts(path, header, payload.data(), payload.size());
}

void write_bytes(const std::filesystem::path& path, const void* data, size_t size) {
  write_parts(path, std::string(), data, size);
}

}  // namespace kvb
