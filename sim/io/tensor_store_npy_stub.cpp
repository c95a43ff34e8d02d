// Placeholder until the tensor-file loaders land (sim/io/tensor_store.cpp on the
// loaders branch replaces this file; delete it at merge). It reads exactly one kind
// of file: a single little-endian float32 C-order .npy array, named after the file
// stem. Everything else is a kvb::Error saying the loaders are not merged yet.
#include <cstring>
#include <fstream>
#include <sstream>

#include "sim/core/error.h"
#include "sim/io/tensor_store.h"

namespace kvb {

namespace {

class NpyF32Store final : public TensorStore {
 public:
  explicit NpyF32Store(const std::filesystem::path& p) : path_(p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(p.string(), "cannot open");
    char magic[8];
    in.read(magic, 8);
    if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(p.string(), "not a .npy file");
    uint32_t hlen = 0;
    if (magic[6] == 1) {
      unsigned char b[2];
      in.read(reinterpret_cast<char*>(b), 2);
      hlen = b[0] | (b[1] << 8);
    } else {
      unsigned char b[4];
      in.read(reinterpret_cast<char*>(b), 4);
      hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    }
    std::string header(hlen, '\0');
    in.read(header.data(), hlen);
    if (!in) fail(p.string(), "truncated .npy header");
    if (header.find("'descr': '<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
      fail(p.string(), "only little-endian float32 C-order .npy files can be read until the tensor loaders are merged");
    const size_t open = header.find('(', header.find("'shape'")), close = header.find(')', open);
    if (open == std::string::npos || close == std::string::npos) fail(p.string(), "malformed .npy shape");
    std::stringstream dims(header.substr(open + 1, close - open - 1));
    std::string item;
    while (std::getline(dims, item, ','))
      if (item.find_first_not_of(" ") != std::string::npos) info_.shape.push_back(std::stoll(item));
    info_.name = p.stem().string();
    info_.dtype = DType::F32;
    info_.file = p.string();
    data_.shape = info_.shape;
    data_.data.resize(static_cast<size_t>(Tensor::count(info_.shape)));
    in.read(reinterpret_cast<char*>(data_.data.data()), static_cast<std::streamsize>(data_.data.size() * sizeof(float)));
    if (!in) fail(p.string(), "truncated .npy data");
  }
  const std::filesystem::path& path() const override { return path_; }
  std::vector<TensorInfo> list() const override { return {info_}; }
  bool contains(const std::string& name) const override { return name == info_.name; }
  const TensorInfo& info(const std::string& name) const override {
    if (!contains(name)) fail(path_.string(), "no tensor '" + name + "' (it holds '" + info_.name + "')");
    return info_;
  }
  Tensor read_f32(const std::string& name) const override {
    (void)info(name);
    return data_;
  }
  std::vector<int64_t> read_i64(const std::string& name) const override {
    (void)info(name);
    fail(path_.string(), "float tensor '" + name + "' cannot be read as integers");
  }

 private:
  std::filesystem::path path_;
  TensorInfo info_;
  Tensor data_;
};

}  // namespace

std::unique_ptr<TensorStore> TensorStore::open(const std::filesystem::path& path) {
  if (path.extension() == ".npy") return std::make_unique<NpyF32Store>(path);
  fail(path.string(), "reading this kind of tensor file needs the tensor loaders, which are not merged on this branch "
                      "yet (only float32 .npy files can be read)");
}

}  // namespace kvb
