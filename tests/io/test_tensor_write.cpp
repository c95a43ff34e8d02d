// .npy and safetensors writers: headers as NumPy / safetensors define them, data
// byte-exact, and read back through TensorStore.
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "sim/core/error.h"
#include "sim/io/tensor_store.h"
#include "sim/io/tensor_write.h"
#include "test_util.h"

using namespace kvb;

namespace {
std::vector<char> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("write_npy_f32: NumPy 1.0 header, 64-byte aligned data, reads back") {
  const auto dir = kvb::test::scratch_dir("tensor_write_npy");
  const std::vector<float> x = kvb::test::random_normal(2 * 3 * 5, 1);
  write_npy_f32(dir / "a.npy", {2, 3, 5}, x.data());
  const std::vector<char> b = slurp(dir / "a.npy");
  REQUIRE(b.size() > 10);
  CHECK(std::memcmp(b.data(), "\x93NUMPY\x01\x00", 8) == 0);
  const size_t hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
  CHECK((10 + hlen) % 64 == 0);
  const std::string header(b.data() + 10, hlen);
  CHECK(header.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 5), }") == 0);
  CHECK(header.back() == '\n');
  REQUIRE(b.size() == 10 + hlen + x.size() * 4);
  CHECK(std::memcmp(b.data() + 10 + hlen, x.data(), x.size() * 4) == 0);
  const auto store = TensorStore::open(dir / "a.npy");
  const Tensor t = store->read_f32("a");
  CHECK(t.shape == std::vector<int64_t>{2, 3, 5});
  CHECK(t.data == x);
  write_npy_f32(dir / "v.npy", {7}, x.data());
  CHECK(std::string(slurp(dir / "v.npy").data() + 10, 60).find("'shape': (7,), }") != std::string::npos);
  CHECK(TensorStore::open(dir / "v.npy")->read_f32("v").shape == std::vector<int64_t>{7});
  CHECK_THROWS_AS(write_npy_f32(dir / "no-such-dir" / "x.npy", {1}, x.data()), Error);
}

TEST_CASE("write_safetensors_f32: header offsets, metadata and data") {
  const auto dir = kvb::test::scratch_dir("tensor_write_st");
  const std::vector<float> a = kvb::test::random_normal(6, 2), b = kvb::test::random_normal(4, 3);
  write_safetensors_f32(dir / "t.safetensors", {{"a", {2, 3}, a.data()}, {"layers.0.b", {4}, b.data()}},
                        {{"format", "q4_0"}});
  const std::vector<char> f = slurp(dir / "t.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  CHECK((8 + n) % 8 == 0);
  const auto h = nlohmann::json::parse(std::string(f.data() + 8, n));
  CHECK(h["__metadata__"]["format"] == "q4_0");
  CHECK(h["a"]["dtype"] == "F32");
  CHECK(h["a"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(h["a"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(h["layers.0.b"]["data_offsets"] == nlohmann::json::array({24, 40}));
  REQUIRE(f.size() == 8 + n + 40);
  CHECK(std::memcmp(f.data() + 8 + n, a.data(), 24) == 0);
  CHECK(std::memcmp(f.data() + 8 + n + 24, b.data(), 16) == 0);
  CHECK_THROWS_AS(write_safetensors_f32(dir / "d.safetensors", {{"a", {1}, a.data()}, {"a", {1}, a.data()}}), Error);
}
