#include "sim/io/tensor_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/core/strings.h"
#include "sim/io/atomic_file.h"
#include "sim/io/dtype_convert.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

bool writable_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }
bool writable_int(DType d) { return d == DType::I32 || d == DType::I64; }

// Checks that a tensor is writable and returns its element count.
int64_t check_tensor(const TensorToWrite& t, const std::string& where) {
  const std::string tw = where + ": tensor '" + t.name + "': ";
  if (writable_float(t.dtype)) {
    if (!t.floats) throw Error(tw + "no float values given for dtype " + dtype_name(t.dtype));
  } else if (writable_int(t.dtype)) {
    if (!t.ints) throw Error(tw + "no integer values given for dtype " + dtype_name(t.dtype));
  } else {
    throw Error(tw + "cannot write dtype " + std::string(dtype_name(t.dtype)) + " (writable: F32, F16, BF16, I32, I64)");
  }
  return checked_numel(t.shape, dtype_bytes(t.dtype), tw);
}

// A finite value that a 16-bit float cannot hold (|x| beyond F16's 65504) would be
// written as Inf, and every reader would reject the file later: refuse it here.
void require_no_overflow(const TensorToWrite& t, int64_t i, bool overflowed, const std::string& where) {
  if (!overflowed || !std::isfinite(t.floats[i])) return;
  throw Error(where + ": tensor '" + t.name + "': value " + format_double(t.floats[i]) + " at flat index " +
              std::to_string(i) + " overflows " + dtype_name(t.dtype) + " (it would be stored as Inf); store F32");
}

// Encodes elements [begin, end) of t into little-endian bytes appended to out.
void encode(const TensorToWrite& t, int64_t begin, int64_t end, std::vector<uint8_t>& out, const std::string& where) {
  const int eb = dtype_bytes(t.dtype);
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>((end - begin) * eb));
  uint8_t* dst = out.data() + base;
  for (int64_t i = begin; i < end; ++i, dst += eb) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(dst, &t.floats[i], 4); break;
      case DType::F16: {
        const uint16_t h = f32_to_f16_bits(t.floats[i]);
        require_no_overflow(t, i, (h & 0x7c00u) == 0x7c00u, where);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::BF16: {
        const uint16_t b = f32_to_bf16_bits(t.floats[i]);
        require_no_overflow(t, i, (b & 0x7f80u) == 0x7f80u, where);
        std::memcpy(dst, &b, 2);
        break;
      }
      case DType::I32: {
        const int64_t v = t.ints[i];
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          throw Error(where + ": tensor '" + t.name + "': value " + std::to_string(v) + " at flat index " +
                      std::to_string(i) + " does not fit I32");
        const int32_t w = static_cast<int32_t>(v);
        std::memcpy(dst, &w, 4);
        break;
      }
      case DType::I64: std::memcpy(dst, &t.ints[i], 8); break;
      default: throw Error("internal: unwritable dtype");
    }
  }
}

// Streams a tensor's bytes in bounded chunks.
void write_elements(AtomicFileWriter& out, const TensorToWrite& t, int64_t numel, const std::string& where) {
  constexpr int64_t kChunk = 1 << 20;  // elements per write
  std::vector<uint8_t> buf;
  for (int64_t b = 0; b < numel; b += kChunk) {
    buf.clear();
    encode(t, b, std::min(numel, b + kChunk), buf, where);
    out.write(buf.data(), buf.size());
  }
}

const char* npy_descr(DType d) {
  switch (d) {
    case DType::F32: return "<f4";
    case DType::F16: return "<f2";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    default: return nullptr;  // NumPy has no bfloat16
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

TensorToWrite TensorToWrite::of_floats(std::string name, std::vector<int64_t> shape, const float* values, DType dtype) {
  TensorToWrite t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.floats = values;
  return t;
}

TensorToWrite TensorToWrite::of_tensor(std::string name, const Tensor& t, DType dtype) {
  return of_floats(std::move(name), t.shape, t.ptr(), dtype);
}

TensorToWrite TensorToWrite::of_ints(std::string name, std::vector<int64_t> shape, const int64_t* values, DType dtype) {
  TensorToWrite t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.ints = values;
  return t;
}

DType parse_float_dtype(const std::string& text, const std::string& where) {
  const std::string s = lower(text);
  if (s == "f32" || s == "fp32" || s == "float32") return DType::F32;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw ConfigError(where + ": unknown dtype '" + text + "' (f32, f16 or bf16)");
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string where = path.string();
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::vector<int64_t> numels;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw Error(where + ": tensor name '" + t.name + "' is not allowed in a safetensors file");
    if (!names.insert(t.name).second) throw Error(where + ": tensor '" + t.name + "' given twice");
    const int64_t n = check_tensor(t, where);
    numels.push_back(n);
    const uint64_t bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(dtype_bytes(t.dtype));
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text += ' ';
  AtomicFileWriter out(path);
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(len, 8);
  out.write(text);
  for (size_t i = 0; i < tensors.size(); ++i) write_elements(out, tensors[i], numels[i], where);
  out.commit();
}

void write_npy(const fs::path& path, const TensorToWrite& t) {
  const std::string where = path.string();
  const int64_t numel = check_tensor(t, where);
  const char* descr = npy_descr(t.dtype);
  if (!descr)
    throw Error(where + ": tensor '" + t.name + "': NumPy has no " + dtype_name(t.dtype) +
                " type; write F32 or F16 to .npy, or use .safetensors");
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += std::to_string(t.shape[i]) + (t.shape.size() == 1 ? "," : (i + 1 < t.shape.size() ? ", " : ""));
  shape += ")";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic (6) + version (2) + length (2) + dict + '\n' padded to a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  if (dict.size() > 65535) throw Error(where + ": .npy header too long (rank " + std::to_string(t.shape.size()) + ")");
  AtomicFileWriter out(path);
  const uint8_t magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size() & 0xff),
                             static_cast<uint8_t>(dict.size() >> 8)};
  out.write(magic, sizeof magic);
  out.write(dict);
  write_elements(out, t, numel, where);
  out.commit();
}

void write_tensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  const std::string ext = lower(path.extension().string());
  if (ext == ".safetensors") return write_safetensors(path, tensors, metadata);
  if (ext == ".npy") {
    if (tensors.size() != 1)
      throw Error(path.string() + ": a .npy file holds one array, but " + std::to_string(tensors.size()) +
                  " tensors were to be written; use .safetensors");
    return write_npy(path, tensors[0]);
  }
  throw ConfigError(path.string() + ": unknown output extension '" + path.extension().string() +
                    "' (.safetensors or .npy)");
}

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
