// Writers of small tensor files for the loader tests: safetensors images, .npy
// images and zip archives (stored or deflated members, optional zip64 records),
// written independently of sim/io so that the readers are checked against the formats'
// specifications rather than against themselves.
#pragma once
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "test_util.h"

namespace kvb::test {

using Bytes = std::vector<uint8_t>;

template <class T>
Bytes raw_bytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline Bytes f16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(f32_to_f16_bits(f));
  return raw_bytes(h);
}

inline Bytes bf16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(f32_to_bf16_bits(f));
  return raw_bytes(h);
}

inline void write_bytes(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(out.good());
}

inline void put_le(Bytes& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

inline std::string shape_json(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// ---- safetensors ------------------------------------------------------------------

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  Bytes bytes;
};

// The JSON header of tensors laid out back to back, in the given order.
inline std::string safetensors_header(const std::vector<RawTensor>& tensors,
                                      const std::map<std::string, std::string>& metadata = {}) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      h += (first ? "" : ",") + ("\"" + k + "\":\"" + v + "\"");
      first = false;
    }
    h += "},";
  }
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RawTensor& t = tensors[i];
    h += (i ? "," : "") + ("\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + shape_json(t.shape) +
                           ",\"data_offsets\":[" + std::to_string(offset) + "," +
                           std::to_string(offset + t.bytes.size()) + "]}");
    offset += t.bytes.size();
  }
  return h + "}";
}

// A safetensors file image: header (padded with spaces to a multiple of 8, as the
// reference writer does) and the tensors' bytes back to back. `header` overrides the
// generated JSON (for malformed-header tests).
inline Bytes safetensors_image(const std::vector<RawTensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {},
                               std::string header = "") {
  if (header.empty()) header = safetensors_header(tensors, metadata);
  while (header.size() % 8) header += ' ';
  Bytes b;
  put_le(b, header.size(), 8);
  b.insert(b.end(), header.begin(), header.end());
  for (const RawTensor& t : tensors) b.insert(b.end(), t.bytes.begin(), t.bytes.end());
  return b;
}

inline RawTensor f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  return {name, "F32", shape, raw_bytes(v)};
}

// ---- NumPy ------------------------------------------------------------------------

// An .npy image (format 1.0 unless version is 2 or 3), header padded to 64 bytes.
inline Bytes npy_image(const std::string& descr, const std::vector<int64_t>& shape, const Bytes& data,
                       bool fortran_order = false, int version = 1) {
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_text += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  shape_text += ")";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran_order ? "True" : "False") +
                     ", 'shape': " + shape_text + ", }";
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64) dict += ' ';
  dict += '\n';
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(version), 0};
  put_le(b, dict.size(), version == 1 ? 2 : 4);
  b.insert(b.end(), dict.begin(), dict.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// ---- zip --------------------------------------------------------------------------

struct ZipEntry {
  std::string name;
  Bytes data;
  bool deflate = false;
};

inline Bytes raw_deflate(const Bytes& in) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&zs, static_cast<uLong>(in.size())) + 16);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// A zip archive image. zip64: every central-directory size and offset is 0xFFFFFFFF
// with the values in a zip64 extra field, and the archive ends with zip64
// end-of-central-directory record and locator (as writers do for > 4 GiB archives).
inline Bytes zip_image(const std::vector<ZipEntry>& entries, bool zip64 = false) {
  Bytes b, central;
  for (const ZipEntry& e : entries) {
    const Bytes payload = e.deflate ? raw_deflate(e.data) : e.data;
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, e.data.data(), static_cast<uInt>(e.data.size())));
    const uint64_t local_offset = b.size();
    const uint16_t method = e.deflate ? 8 : 0;
    // local header
    put_le(b, 0x04034b50, 4);
    put_le(b, 20, 2);
    put_le(b, 0, 2);
    put_le(b, method, 2);
    put_le(b, 0, 4);  // time, date
    put_le(b, crc, 4);
    put_le(b, payload.size(), 4);
    put_le(b, e.data.size(), 4);
    put_le(b, e.name.size(), 2);
    put_le(b, 0, 2);
    b.insert(b.end(), e.name.begin(), e.name.end());
    b.insert(b.end(), payload.begin(), payload.end());
    // central directory header
    put_le(central, 0x02014b50, 4);
    put_le(central, zip64 ? 45 : 20, 2);
    put_le(central, zip64 ? 45 : 20, 2);
    put_le(central, 0, 2);
    put_le(central, method, 2);
    put_le(central, 0, 4);
    put_le(central, crc, 4);
    put_le(central, zip64 ? 0xffffffff : payload.size(), 4);
    put_le(central, zip64 ? 0xffffffff : e.data.size(), 4);
    put_le(central, e.name.size(), 2);
    put_le(central, zip64 ? 4 + 24 + 8 : 8, 2);  // extra length (zip64 field + a dummy field)
    put_le(central, 0, 2);                        // comment length
    put_le(central, 0, 2);                        // disk start
    put_le(central, 0, 2);                        // internal attributes
    put_le(central, 0, 4);                        // external attributes
    put_le(central, zip64 ? 0xffffffff : local_offset, 4);
    central.insert(central.end(), e.name.begin(), e.name.end());
    put_le(central, 0x5455, 2);  // an unrelated extra field first (extended timestamp)
    put_le(central, 4, 2);
    put_le(central, 0, 4);
    if (zip64) {
      put_le(central, 0x0001, 2);
      put_le(central, 24, 2);
      put_le(central, e.data.size(), 8);
      put_le(central, payload.size(), 8);
      put_le(central, local_offset, 8);
    }
  }
  const uint64_t dir_offset = b.size();
  b.insert(b.end(), central.begin(), central.end());
  if (zip64) {
    const uint64_t z = b.size();
    put_le(b, 0x06064b50, 4);
    put_le(b, 44, 8);
    put_le(b, 45, 2);
    put_le(b, 45, 2);
    put_le(b, 0, 4);
    put_le(b, 0, 4);
    put_le(b, entries.size(), 8);
    put_le(b, entries.size(), 8);
    put_le(b, central.size(), 8);
    put_le(b, dir_offset, 8);
    put_le(b, 0x07064b50, 4);  // locator
    put_le(b, 0, 4);
    put_le(b, z, 8);
    put_le(b, 1, 4);
  }
  put_le(b, 0x06054b50, 4);
  put_le(b, 0, 2);
  put_le(b, 0, 2);
  put_le(b, zip64 ? 0xffff : entries.size(), 2);
  put_le(b, zip64 ? 0xffff : entries.size(), 2);
  put_le(b, zip64 ? 0xffffffff : central.size(), 4);
  put_le(b, zip64 ? 0xffffffff : dir_offset, 4);
  const std::string comment = "kvbudget test archive";
  put_le(b, comment.size(), 2);
  b.insert(b.end(), comment.begin(), comment.end());
  return b;
}

// ---- errors -----------------------------------------------------------------------

// The message of the kvb::Error that f throws; fails the test (and returns "") when it
// throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kvb::Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected a kvb::Error, nothing was thrown");
  return "";
}

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace kvb::test
