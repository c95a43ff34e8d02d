// NumPy tensors: one .npy file, a directory of .npy files (tensor name = file stem),
// or an .npz archive (tensor name = member name minus ".npy"; members stored or
// deflated). Plain .npy files and stored members are converted straight from the
// mapping; deflated members are inflated into a temporary buffer first (the data is
// not in the file in readable form). Fortran-order arrays are transposed to row-major.
#include <algorithm>

#include "sim/core/error.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/mapped_file.h"
#include "sim/io/npy.h"
#include "sim/io/store_common.h"
#include "sim/io/zip.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Where one array's .npy image lives: a whole mapped file, or a member of a mapped zip.
struct NpySource {
  std::shared_ptr<const MappedFile> file;
  bool in_zip = false;
  ZipMember member;  // when in_zip
  NpyHeader header;
  std::string where;  // "a.npy" or "a.npz: member 'x.npy'" for messages
};

class NumpyStore final : public IndexedTensorStore {
 public:
  explicit NumpyStore(fs::path p) : IndexedTensorStore(std::move(p)) {}

  void add_npy_file(const fs::path& file, const std::string& name);
  void add_npz(const fs::path& file);

  Tensor read_f32(const std::string& name) const override;
  std::vector<int64_t> read_i64(const std::string& name) const override;

 private:
  void add(const std::string& name, NpySource src);
  // Calls use(bytes) with the array's data bytes (header.data_bytes() of them).
  template <class Use>
  void with_data(const NpySource& s, Use&& use) const;

  std::map<std::string, NpySource> sources_;
};

void NumpyStore::add(const std::string& name, NpySource src) {
  if (infos_.count(name)) fail(src.where, "two arrays are named '" + name + "'");
  TensorInfo inf;
  inf.name = name;
  inf.dtype = src.header.dtype;
  inf.shape = src.header.shape;
  inf.file = src.file->where();
  infos_[name] = std::move(inf);
  sources_[name] = std::move(src);
}

void NumpyStore::add_npy_file(const fs::path& file, const std::string& name) {
  NpySource s;
  s.file = MappedFile::open(file);
  s.where = s.file->where();
  s.header = parse_npy_header(s.file->data(), s.file->size(), s.where);
  const uint64_t have = s.file->size() - s.header.data_offset;
  if (have < s.header.data_bytes())
    fail(s.where, "truncated .npy: shape " + shape_str(s.header.shape) + " x " + dtype_name(s.header.dtype) +
                      " needs " + std::to_string(s.header.data_bytes()) + " data bytes, the file has " +
                      std::to_string(have));
  add(name, std::move(s));
}

void NumpyStore::add_npz(const fs::path& file) {
  const std::shared_ptr<const MappedFile> zip = MappedFile::open(file);
  for (const ZipMember& m : read_zip_directory(*zip)) {
    if (!ends_with(m.name, ".npy")) continue;  // np.load also ignores non-array members for arrays
    NpySource s;
    s.file = zip;
    s.in_zip = true;
    s.member = m;
    s.where = zip->where() + ": member '" + m.name + "'";
    // Only the header is needed now: inflate a prefix, longer if the header is long.
    std::vector<uint8_t> head = zip_inflate(*zip, m, 4096);
    const uint64_t header_size = npy_header_size(head.data(), head.size(), s.where);
    if (header_size > head.size() && head.size() < m.uncompressed_size) head = zip_inflate(*zip, m, header_size);
    s.header = parse_npy_header(head.data(), head.size(), s.where);
    const uint64_t have = m.uncompressed_size - std::min(m.uncompressed_size, s.header.data_offset);
    if (have < s.header.data_bytes())
      fail(s.where, "truncated array: shape " + shape_str(s.header.shape) + " x " + dtype_name(s.header.dtype) +
                        " needs " + std::to_string(s.header.data_bytes()) + " data bytes, the member has " +
                        std::to_string(have));
    add(m.name.substr(0, m.name.size() - 4), std::move(s));
  }
}

template <class Use>
void NumpyStore::with_data(const NpySource& s, Use&& use) const {
  if (!s.in_zip) return use(s.file->data() + s.header.data_offset);
  if (s.member.method == 0) {
    zip_check_stored_crc(*s.file, s.member);
    return use(s.file->data() + s.member.data_offset + s.header.data_offset);
  }
  const std::vector<uint8_t> inflated = zip_inflate(*s.file, s.member, s.member.uncompressed_size);
  use(inflated.data() + s.header.data_offset);
}

Tensor NumpyStore::read_f32(const std::string& name) const {
  const TensorInfo& inf = info(name);
  const NpySource& s = sources_.at(name);
  Tensor t(inf.shape);
  with_data(s, [&](const uint8_t* bytes) {
    require_fits_f32(bytes, inf.dtype, t.numel(), inf.file + ": tensor '" + name + "'");
    if (s.header.fortran_order)
      convert_fortran_to_f32(bytes, inf.dtype, inf.shape, t.ptr());
    else
      convert_to_f32(bytes, inf.dtype, t.numel(), t.ptr());
  });
  return t;
}

std::vector<int64_t> NumpyStore::read_i64(const std::string& name) const {
  const TensorInfo& inf = info(name);
  require_integer_dtype(inf);
  const NpySource& s = sources_.at(name);
  std::vector<int64_t> out(static_cast<size_t>(Tensor::count(inf.shape)));
  with_data(s, [&](const uint8_t* bytes) {
    if (s.header.fortran_order)
      convert_fortran_to_i64(bytes, inf.dtype, inf.shape, out.data());
    else
      convert_to_i64(bytes, inf.dtype, static_cast<int64_t>(out.size()), out.data());
  });
  return out;
}

}  // namespace

std::unique_ptr<TensorStore> open_npy_file(const fs::path& file) {
  auto store = std::make_unique<NumpyStore>(file);
  store->add_npy_file(file, file.stem().string());
  return store;
}

std::unique_ptr<TensorStore> open_npy_directory(const fs::path& dir) {
  auto store = std::make_unique<NumpyStore>(dir);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".npy") files.push_back(entry.path());  // MappedFile refuses a FIFO, say
  std::sort(files.begin(), files.end());
  if (files.empty()) fail(dir.string(), "directory holds no .npy files");
  for (const fs::path& f : files) store->add_npy_file(f, f.stem().string());
  return store;
}

std::unique_ptr<TensorStore> open_npz(const fs::path& file) {
  auto store = std::make_unique<NumpyStore>(file);
  store->add_npz(file);
  return store;
}

}  // namespace kvb
