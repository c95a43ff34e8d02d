// One safetensors file: [u64 little-endian header length N][N bytes of JSON header]
// [byte buffer]. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} with offsets relative to the start of the byte buffer,
// plus an optional "__metadata__" object of strings.
//
// Checked when opening: the header fits in the file, is a JSON object, every dtype is
// known, no tensor name appears twice (nlohmann::json alone would keep the last),
// every tensor's [begin, end) lies inside the buffer, spans exactly numel × dtype
// size bytes, and no two tensors overlap. (Gaps between tensors are tolerated, though
// the format's writers never leave any.)
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "sim/core/error.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/json_file.h"
#include "sim/io/mapped_file.h"
#include "sim/io/store_common.h"

namespace kvb {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class SafetensorsStore final : public IndexedTensorStore {
 public:
  explicit SafetensorsStore(const fs::path& file);

  Tensor read_f32(const std::string& name) const override;
  std::vector<int64_t> read_i64(const std::string& name) const override;
  void read_raw(const std::string& name, void* dst) const override;
  void read_raw_rows(const std::string& name, int64_t first, int64_t count, void* dst) const override;
  std::map<std::string, std::string> metadata() const override { return metadata_; }

 private:
  const uint8_t* bytes_of(const std::string& name) const { return buffer_ + begin_.at(name); }
  void parse_header(const json& header, uint64_t buffer_size);

  std::shared_ptr<const MappedFile> file_;
  const uint8_t* buffer_ = nullptr;         // start of the byte buffer, inside the mapping
  std::map<std::string, uint64_t> begin_;   // tensor name -> byte offset into the buffer
  std::map<std::string, std::string> metadata_;
};

std::string metadata_value(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

SafetensorsStore::SafetensorsStore(const fs::path& file) : IndexedTensorStore(file) {
  file_ = MappedFile::open(file);
  const std::string where = file_->where();
  const uint64_t size = file_->size();
  if (size < 8)
    fail(where, "truncated: " + std::to_string(size) +
                    " bytes, but a safetensors file starts with an 8-byte header length");
  const uint64_t header_len = load_le(file_->data(), 8);
  if (header_len > size - 8)
    fail(where, "header length " + std::to_string(header_len) + " extends beyond the file (" + std::to_string(size) +
                    " bytes; truncated or not a safetensors file)");
  const char* header_begin = reinterpret_cast<const char*>(file_->data() + 8);
  // JSON text holds no NUL byte; the parser would take one as the end of the header
  // and silently ignore the rest.
  if (const void* nul = std::memchr(header_begin, 0, header_len))
    fail(where, "bad JSON header: a NUL byte at header offset " +
                    std::to_string(static_cast<const char*>(nul) - header_begin) + " (corrupt file)");
  json header;
  try {
    header = parse_json_checking_duplicates(
        std::string_view(header_begin, header_len), [&](const std::string& key, const std::string& parent) {
          if (parent.empty()) throw Error("duplicate tensor name '" + key + "' in the header of " + where);
          fail(where, "duplicate key '" + key + "' in the header entry '" + parent + "'");
        });
  } catch (const json::exception& e) {
    fail(where, std::string("bad JSON header: ") + e.what());
  }
  if (!header.is_object()) fail(where, "bad header: the JSON header must be an object, got " + std::string(header.type_name()));
  buffer_ = file_->data() + 8 + header_len;
  parse_header(header, size - 8 - header_len);
}

void SafetensorsStore::parse_header(const json& header, uint64_t buffer_size) {
  const std::string where = file_->where();
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(where, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.items()) metadata_[k] = metadata_value(v);
      continue;
    }
    const std::string tw = "tensor '" + name + "': ";
    if (!entry.is_object()) fail(where, tw + "header entry must be an object with dtype, shape and data_offsets");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) fail(where, tw + "missing or non-string \"dtype\"");
    if (shape_it == entry.end() || !shape_it->is_array()) fail(where, tw + "missing or non-array \"shape\"");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      fail(where, tw + "\"data_offsets\" must be an array [begin, end]");

    TensorInfo inf;
    inf.name = name;
    inf.file = where;
    const std::string dtype = dtype_it->get<std::string>();
    const auto dt = dtype_from_name(dtype);
    if (!dt) fail(where, tw + "unknown dtype '" + dtype + "' (known: " + known_dtype_names() + ")");
    inf.dtype = *dt;
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned()) fail(where, tw + "shape " + shape_it->dump() + " must hold non-negative integers");
      inf.shape.push_back(d.get<int64_t>());
    }
    for (const json& o : *offsets_it)
      if (!o.is_number_unsigned())
        fail(where, tw + "data_offsets " + offsets_it->dump() + " must hold non-negative integers");
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end) fail(where, tw + "data_offsets " + offsets_it->dump() + " has begin > end");
    if (end > buffer_size)
      fail(where, tw + "data_offsets " + offsets_it->dump() + " out of range: the data section holds " +
                      std::to_string(buffer_size) + " bytes (file truncated?)");
    const int64_t numel = checked_numel(inf.shape, dtype_bytes(inf.dtype), where + ": tensor '" + name + "'");
    const uint64_t expected = static_cast<uint64_t>(numel) * static_cast<uint64_t>(dtype_bytes(inf.dtype));
    if (end - begin != expected)
      fail(where, tw + "data_offsets " + offsets_it->dump() + " span " + std::to_string(end - begin) +
                      " bytes, but shape " + shape_str(inf.shape) + " x " + dtype + " (" +
                      std::to_string(dtype_bytes(inf.dtype)) + " bytes) needs " + std::to_string(expected));
    begin_[name] = begin;
    if (end > begin) spans.push_back({begin, end, name});
    infos_[name] = std::move(inf);
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      fail(where, "tensors '" + spans[i - 1].name + "' [" + std::to_string(spans[i - 1].begin) + ", " +
                      std::to_string(spans[i - 1].end) + ") and '" + spans[i].name + "' [" +
                      std::to_string(spans[i].begin) + ", " + std::to_string(spans[i].end) +
                      ") overlap in the data section");
}

Tensor SafetensorsStore::read_f32(const std::string& name) const {
  const TensorInfo& inf = info(name);
  Tensor t(inf.shape);
  const uint8_t* bytes = bytes_of(name);
  const uint64_t n = static_cast<uint64_t>(t.numel() * dtype_bytes(inf.dtype));
  file_->prefetch(bytes, n);
  require_fits_f32(bytes, inf.dtype, t.numel(), inf.file + ": tensor '" + name + "'");
  convert_to_f32(bytes, inf.dtype, t.numel(), t.ptr());
  file_->release(bytes, n);
  return t;
}

void SafetensorsStore::read_raw(const std::string& name, void* dst) const {
  const TensorInfo& inf = info(name);
  const uint64_t n = static_cast<uint64_t>(Tensor::count(inf.shape) * dtype_bytes(inf.dtype));
  // Read from the file straight into dst (MappedFile::copy_out): the mapping's pages are
  // not touched, so a checkpoint being loaded is not held twice.
  file_->copy_out(bytes_of(name), n, dst);
}

void SafetensorsStore::read_raw_rows(const std::string& name, int64_t first, int64_t count, void* dst) const {
  const TensorInfo& inf = info(name);
  const std::string tw = inf.file + ": tensor '" + name + "': ";
  if (inf.shape.empty()) throw Error(tw + "a scalar has no rows to read");
  const int64_t rows = inf.shape.front();
  if (first < 0 || count < 0 || first > rows || count > rows - first)
    throw Error(tw + "rows [" + std::to_string(first) + ", " + std::to_string(first + count) + ") outside its " +
                std::to_string(rows) + " rows");
  if (rows == 0 || count == 0) return;
  const uint64_t row_bytes =
      static_cast<uint64_t>(Tensor::count(inf.shape) / rows) * static_cast<uint64_t>(dtype_bytes(inf.dtype));
  file_->copy_out(bytes_of(name) + static_cast<uint64_t>(first) * row_bytes, static_cast<uint64_t>(count) * row_bytes,
                  dst);
}

std::vector<int64_t> SafetensorsStore::read_i64(const std::string& name) const {
  const TensorInfo& inf = info(name);
  require_integer_dtype(inf);
  std::vector<int64_t> out(static_cast<size_t>(Tensor::count(inf.shape)));
  convert_to_i64(bytes_of(name), inf.dtype, static_cast<int64_t>(out.size()), out.data());
  return out;
}

}  // namespace

std::unique_ptr<TensorStore> open_safetensors(const fs::path& file) { return std::make_unique<SafetensorsStore>(file); }

}  // namespace kvb
