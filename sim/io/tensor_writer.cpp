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
// `index` is the value's flat index in its tensor.
void require_no_overflow(const TensorLayout& t, float value, int64_t index, bool overflowed, const std::string& where) {
  if (!overflowed || !std::isfinite(value)) return;
  throw Error(where + ": tensor '" + t.name + "': value " + format_double(value) + " at flat index " +
              std::to_string(index) + " overflows " + dtype_name(t.dtype) + " (it would be stored as Inf); store F32");
}

// Encodes `count` values of tensor t (floats or ints, by its dtype; null for zeros),
// the first at flat index `first_index`, into little-endian bytes appended to out.
void encode(const TensorLayout& t, const float* floats, const int64_t* ints, int64_t count, int64_t first_index,
            std::vector<uint8_t>& out, const std::string& where) {
  const int eb = dtype_bytes(t.dtype);
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(count * eb));
  uint8_t* dst = out.data() + base;
  for (int64_t k = 0; k < count; ++k, dst += eb) {
    const float f = floats ? floats[k] : 0.0f;
    const int64_t v = ints ? ints[k] : 0;
    switch (t.dtype) {
      case DType::F32: std::memcpy(dst, &f, 4); break;
      case DType::F16: {
        const uint16_t h = f32_to_f16_bits(f);
        require_no_overflow(t, f, first_index + k, (h & 0x7c00u) == 0x7c00u, where);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::BF16: {
        const uint16_t b = f32_to_bf16_bits(f);
        require_no_overflow(t, f, first_index + k, (b & 0x7f80u) == 0x7f80u, where);
        std::memcpy(dst, &b, 2);
        break;
      }
      case DType::I32: {
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          throw Error(where + ": tensor '" + t.name + "': value " + std::to_string(v) + " at flat index " +
                      std::to_string(first_index + k) + " does not fit I32");
        const int32_t w = static_cast<int32_t>(v);
        std::memcpy(dst, &w, 4);
        break;
      }
      case DType::I64: std::memcpy(dst, &v, 8); break;
      default: throw Error("internal: unwritable dtype");
    }
  }
}

TensorLayout layout_of(const TensorToWrite& t) { return TensorLayout{t.name, t.shape, t.dtype}; }

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

// The header and the values of a streamed file (TensorFileStream).
struct TensorFileStream::Impl {
  std::string where;
  std::vector<TensorLayout> tensors;
  std::vector<int64_t> numels;
  std::unique_ptr<AtomicFileWriter> out;
  size_t current = 0;   // the tensor being written
  int64_t written = 0;  // its values written so far
  std::vector<uint8_t> bytes;

  // Moves past every complete tensor (and empty ones).
  void skip_complete() {
    while (current < tensors.size() && written == numels[current]) {
      ++current;
      written = 0;
    }
  }
  void append(const float* floats, const int64_t* ints, bool zeros, int64_t count);
};

void TensorFileStream::Impl::append(const float* floats, const int64_t* ints, bool zeros, int64_t count) {
  if (count < 0) throw Error("internal: " + where + ": append of " + std::to_string(count) + " values");
  if (count == 0) return;
  if (!out) throw Error("internal: " + where + ": append after commit");
  skip_complete();
  if (current == tensors.size())
    throw Error("internal: " + where + ": " + std::to_string(count) + " values appended after the last tensor");
  const TensorLayout& t = tensors[current];
  const std::string tw = where + ": tensor '" + t.name + "': ";
  if (!zeros && writable_float(t.dtype) != (floats != nullptr))
    throw Error("internal: " + tw + (floats ? "float" : "integer") + " values appended to a " + dtype_name(t.dtype) +
                " tensor");
  if (count > numels[current] - written)
    throw Error("internal: " + tw + std::to_string(count) + " values appended, " +
                std::to_string(numels[current] - written) + " of its " + std::to_string(numels[current]) + " remain");
  if ((t.dtype == DType::F32 && floats) || (t.dtype == DType::I64 && ints)) {
    // Stored as held (a little-endian host, as encode's memcpy assumes): no re-encoding.
    out->write(floats ? static_cast<const void*>(floats) : static_cast<const void*>(ints),
               static_cast<size_t>(count) * static_cast<size_t>(dtype_bytes(t.dtype)));
    written += count;
    return;
  }
  constexpr int64_t kChunk = 1 << 20;  // values encoded per write
  for (int64_t b = 0; b < count; b += kChunk) {
    const int64_t n = std::min(kChunk, count - b);
    bytes.clear();
    encode(t, floats ? floats + b : nullptr, ints ? ints + b : nullptr, n, written + b, bytes, where);
    out->write(bytes.data(), bytes.size());
  }
  written += count;
}

TensorFileStream::TensorFileStream(const fs::path& path, std::vector<TensorLayout> tensors,
                                   const std::map<std::string, std::string>& metadata, TensorFileFormat format)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.where = path.string();
  s.tensors = std::move(tensors);
  for (const TensorLayout& t : s.tensors) {
    if (!writable_float(t.dtype) && !writable_int(t.dtype))
      throw Error(s.where + ": tensor '" + t.name + "': cannot write dtype " + std::string(dtype_name(t.dtype)) +
                  " (writable: F32, F16, BF16, I32, I64)");
    s.numels.push_back(checked_numel(t.shape, dtype_bytes(t.dtype), s.where + ": tensor '" + t.name + "': "));
  }
  std::string header;
  const std::string ext = lower(path.extension().string());
  if (format == TensorFileFormat::ByExtension && ext != ".npy" && ext != ".safetensors")
    throw ConfigError(s.where + ": unknown output extension '" + path.extension().string() +
                      "' (.safetensors or .npy)");
  if (format == TensorFileFormat::Npy || (format == TensorFileFormat::ByExtension && ext == ".npy")) {
    if (s.tensors.size() != 1)
      throw Error(s.where + ": a .npy file holds one array, but " + std::to_string(s.tensors.size()) +
                  " tensors were to be written; use .safetensors");
    const TensorLayout& t = s.tensors.front();
    const char* descr = npy_descr(t.dtype);
    if (!descr)
      throw Error(s.where + ": tensor '" + t.name + "': NumPy has no " + dtype_name(t.dtype) +
                  " type; write F32 or F16 to .npy, or use .safetensors");
    std::string shape = "(";
    for (size_t i = 0; i < t.shape.size(); ++i)
      shape += std::to_string(t.shape[i]) + (t.shape.size() == 1 ? "," : (i + 1 < t.shape.size() ? ", " : ""));
    shape += ")";
    std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    // Magic (6) + version (2) + length (2) + dict + '\n' padded to a multiple of 64.
    const size_t unpadded = 10 + dict.size() + 1;
    dict.append((64 - unpadded % 64) % 64, ' ');
    dict += '\n';
    if (dict.size() > 65535)
      throw Error(s.where + ": .npy header too long (rank " + std::to_string(t.shape.size()) + ")");
    const char magic[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<char>(dict.size() & 0xff),
                            static_cast<char>(dict.size() >> 8)};
    header.assign(magic, sizeof magic);
    header += dict;
  } else {
    nlohmann::json json = nlohmann::json::object();
    if (!metadata.empty()) json["__metadata__"] = metadata;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (size_t i = 0; i < s.tensors.size(); ++i) {
      const TensorLayout& t = s.tensors[i];
      if (t.name.empty() || t.name == "__metadata__")
        throw Error(s.where + ": tensor name '" + t.name + "' is not allowed in a safetensors file");
      if (!names.insert(t.name).second) throw Error(s.where + ": tensor '" + t.name + "' given twice");
      const uint64_t bytes = static_cast<uint64_t>(s.numels[i]) * static_cast<uint64_t>(dtype_bytes(t.dtype));
      json[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = json.dump();
    // Pad the header with spaces so the data section starts 8-byte aligned.
    while ((8 + text.size()) % 8 != 0) text += ' ';
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) header += static_cast<char>(static_cast<uint8_t>(n >> (8 * i)));
    header += text;
  }
  s.out = std::make_unique<AtomicFileWriter>(path);
  s.out->write(header);
}

TensorFileStream::~TensorFileStream() = default;

void TensorFileStream::append_floats(const float* values, int64_t count) { impl_->append(values, nullptr, false, count); }
void TensorFileStream::append_ints(const int64_t* values, int64_t count) { impl_->append(nullptr, values, false, count); }
void TensorFileStream::append_zeros(int64_t count) { impl_->append(nullptr, nullptr, true, count); }

void TensorFileStream::commit() {
  Impl& s = *impl_;
  if (!s.out) throw Error("internal: " + s.where + ": committed twice");
  s.skip_complete();
  if (s.current < s.tensors.size())
    throw Error("internal: " + s.where + ": tensor '" + s.tensors[s.current].name + "' got " +
                std::to_string(s.written) + " of its " + std::to_string(s.numels[s.current]) + " values");
  s.out->commit();
  s.out.reset();
}

namespace {

// The whole tensors of `tensors`, through a TensorFileStream (whose extension decides the format).
void write_through_stream(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                          const std::map<std::string, std::string>& metadata, TensorFileFormat format) {
  const std::string where = path.string();
  std::vector<TensorLayout> layouts;
  std::vector<int64_t> numels;
  for (const TensorToWrite& t : tensors) {
    numels.push_back(check_tensor(t, where));
    layouts.push_back(layout_of(t));
  }
  TensorFileStream stream(path, std::move(layouts), metadata, format);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (writable_float(tensors[i].dtype))
      stream.append_floats(tensors[i].floats, numels[i]);
    else
      stream.append_ints(tensors[i].ints, numels[i]);
  }
  stream.commit();
}

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_through_stream(path, tensors, metadata, TensorFileFormat::Safetensors);
}

void write_npy(const fs::path& path, const TensorToWrite& t) { write_through_stream(path, {t}, {}, TensorFileFormat::Npy); }

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
