// The tensor writers (sim/io/tensor_writer.h), checked by reading their files back with
// the stores (which tests/io/test_tensor_store.cpp checks against the formats' specs), and
// their fp32 shorthands' headers as NumPy / safetensors define them, data byte-exact.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>

#include "io_test_files.h"
#include "sim/core/half.h"
#include "sim/io/tensor_store.h"
#include "sim/io/tensor_writer.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

const std::vector<float> kFloats = {-1.5f, 0.0f, 0.333333f, 65504.0f, 1e-7f, -3.25e-3f};
const std::vector<int64_t> kInts = {-7, 0, 256, 2147483647, -2147483648LL, 42};

bool no_temporaries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().string().find(".tmp.") != std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("safetensors: every writable dtype reads back, with metadata and 8-byte alignment") {
  const fs::path dir = scratch_dir("writer_st");
  const fs::path file = dir / "all.safetensors";
  write_safetensors(file,
                    {TensorToWrite::of_floats("f32", {2, 3}, kFloats.data(), DType::F32),
                     TensorToWrite::of_floats("f16", {6}, kFloats.data(), DType::F16),
                     TensorToWrite::of_floats("bf16", {3, 2}, kFloats.data(), DType::BF16),
                     TensorToWrite::of_ints("i32", {6}, kInts.data(), DType::I32),
                     TensorToWrite::of_ints("i64", {2, 3}, kInts.data(), DType::I64),
                     TensorToWrite::of_floats("scalar", {}, kFloats.data() + 2, DType::F32),
                     TensorToWrite::of_floats("empty", {0, 4}, kFloats.data(), DType::F16)},
                    {{"model", "test"}, {"tokens", "6"}});
  CHECK(no_temporaries(dir));
  const auto store = TensorStore::open(file);
  CHECK(store->metadata().at("model") == "test");
  CHECK(store->info("bf16").dtype == DType::BF16);
  CHECK(store->info("i64").shape == std::vector<int64_t>{2, 3});
  CHECK(store->read_f32("f32").data == kFloats);
  const Tensor f16 = store->read_f32("f16");
  const Tensor bf16 = store->read_f32("bf16");
  for (size_t i = 0; i < kFloats.size(); ++i) {
    CHECK(f16.data[i] == round_to_f16(kFloats[i]));
    CHECK(bf16.data[i] == round_to_bf16(kFloats[i]));
  }
  CHECK(store->read_i64("i32") == kInts);
  CHECK(store->read_i64("i64") == kInts);
  CHECK(store->read_f32("scalar").data == std::vector<float>{kFloats[2]});
  CHECK(store->read_f32("empty").numel() == 0);
  // The data section starts at a multiple of 8 bytes.
  std::ifstream in(file, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CHECK((8 + n) % 8 == 0);
}

TEST_CASE("npy: F32, F16, I32 and I64 read back; shapes of rank 0, 1 and 3") {
  const fs::path dir = scratch_dir("writer_npy");
  write_npy(dir / "a.npy", TensorToWrite::of_floats("a", {3, 1, 2}, kFloats.data(), DType::F32));
  write_npy(dir / "h.npy", TensorToWrite::of_floats("h", {6}, kFloats.data(), DType::F16));
  write_npy(dir / "i.npy", TensorToWrite::of_ints("i", {6}, kInts.data(), DType::I32));
  write_npy(dir / "l.npy", TensorToWrite::of_ints("l", {2, 3}, kInts.data(), DType::I64));
  write_npy(dir / "s.npy", TensorToWrite::of_floats("s", {}, kFloats.data(), DType::F32));
  CHECK(no_temporaries(dir));
  const auto a = TensorStore::open(dir / "a.npy");
  CHECK(a->info("a").shape == std::vector<int64_t>{3, 1, 2});
  CHECK(a->read_f32("a").data == kFloats);
  CHECK(TensorStore::open(dir / "h.npy")->read_f32("h").data[3] == 65504.0f);
  CHECK(TensorStore::open(dir / "i.npy")->read_i64("i") == kInts);
  CHECK(TensorStore::open(dir / "l.npy")->read_i64("l") == kInts);
  CHECK(TensorStore::open(dir / "s.npy")->info("s").shape.empty());
  // The header is padded so that the data starts at a multiple of 64 bytes.
  CHECK((fs::file_size(dir / "a.npy") - 6 * 4) % 64 == 0);
  // write_tensors picks the format from the extension.
  write_tensors(dir / "b.npy", {TensorToWrite::of_floats("b", {2}, kFloats.data())});
  CHECK(TensorStore::open(dir / "b.npy")->read_f32("b").data.size() == 2);
}

TEST_CASE("writer errors name the file and the tensor, and leave no file behind") {
  const fs::path dir = scratch_dir("writer_errors");
  const std::vector<int64_t> too_big = {1, int64_t{1} << 40};
  std::string msg = error_of([&] {
    write_safetensors(dir / "x.safetensors", {TensorToWrite::of_ints("ids", {2}, too_big.data(), DType::I32)});
  });
  CHECK(has(msg, "x.safetensors: tensor 'ids': value 1099511627776 at flat index 1 does not fit I32"));
  CHECK(!fs::exists(dir / "x.safetensors"));
  CHECK(no_temporaries(dir));
  msg = error_of([&] {
    write_safetensors(dir / "d.safetensors", {TensorToWrite::of_floats("a", {1}, kFloats.data()),
                                              TensorToWrite::of_floats("a", {1}, kFloats.data())});
  });
  CHECK(has(msg, "tensor 'a' given twice"));
  msg = error_of([&] { write_npy(dir / "b.npy", TensorToWrite::of_floats("b", {2}, kFloats.data(), DType::BF16)); });
  CHECK(has(msg, "b.npy: tensor 'b': NumPy has no BF16 type"));
  msg = error_of([&] {
    write_tensors(dir / "two.npy", {TensorToWrite::of_floats("a", {1}, kFloats.data()),
                                    TensorToWrite::of_floats("b", {1}, kFloats.data())});
  });
  CHECK(has(msg, "a .npy file holds one array"));
  msg = error_of([&] { write_tensors(dir / "x.bin", {TensorToWrite::of_floats("a", {1}, kFloats.data())}); });
  CHECK(has(msg, "unknown output extension '.bin'"));
  msg = error_of([&] { write_safetensors(dir / "n.safetensors", {TensorToWrite::of_floats("a", {2}, nullptr)}); });
  CHECK(has(msg, "no float values given"));
  msg = error_of([&] { write_safetensors(dir / "no_dir" / "x.safetensors", {}); });
  CHECK(has(msg, "cannot create"));
  // A finite value beyond F16's range would be stored as Inf: refused, nothing written.
  const std::vector<float> big = {1.0f, -1e5f, INFINITY};
  msg = error_of([&] { write_safetensors(dir / "big.safetensors", {TensorToWrite::of_floats("k", {3}, big.data(), DType::F16)}); });
  CHECK(has(msg, "big.safetensors: tensor 'k': value -1e+05 at flat index 1 overflows F16"));
  CHECK(!fs::exists(dir / "big.safetensors"));
  const std::vector<float> inf_only = {1.0f, INFINITY};  // already infinite: written as it is
  CHECK_NOTHROW(
      write_safetensors(dir / "inf.safetensors", {TensorToWrite::of_floats("k", {2}, inf_only.data(), DType::F16)}));
  CHECK(parse_float_dtype("bfloat16", "--dtype") == DType::BF16);
  CHECK(has(error_of([] { parse_float_dtype("f8", "--dtype"); }), "--dtype: unknown dtype 'f8'"));
}

TEST_CASE("an existing file is replaced only once the new one is complete") {
  const fs::path dir = scratch_dir("writer_replace");
  const fs::path file = dir / "t.safetensors";
  write_safetensors(file, {TensorToWrite::of_floats("a", {6}, kFloats.data())});
  const std::vector<int64_t> bad = {int64_t{1} << 40};
  (void)error_of([&] { write_safetensors(file, {TensorToWrite::of_ints("a", {1}, bad.data(), DType::I32)}); });
  CHECK(TensorStore::open(file)->read_f32("a").data == kFloats);
  CHECK(no_temporaries(dir));
}

namespace {
// The bytes of a file.
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

TEST_CASE("TensorFileStream: values appended piece by piece make write_tensors' bytes") {
  const fs::path dir = scratch_dir("writer_stream");
  const std::map<std::string, std::string> meta = {{"model", "test"}};
  write_safetensors(dir / "whole.safetensors",
                    {TensorToWrite::of_floats("f32", {2, 3}, kFloats.data(), DType::F32),
                     TensorToWrite::of_floats("empty", {0, 4}, kFloats.data(), DType::F16),
                     TensorToWrite::of_floats("bf16", {6}, kFloats.data(), DType::BF16),
                     TensorToWrite::of_ints("i32", {6}, kInts.data(), DType::I32),
                     TensorToWrite::of_ints("i64", {3}, kInts.data(), DType::I64)},
                    meta);
  {
    TensorFileStream s(dir / "streamed.safetensors",
                       {{"f32", {2, 3}, DType::F32},
                        {"empty", {0, 4}, DType::F16},
                        {"bf16", {6}, DType::BF16},
                        {"i32", {6}, DType::I32},
                        {"i64", {3}, DType::I64}},
                       meta);
    s.append_floats(kFloats.data(), 2);  // rows of f32 in two pieces; "empty" is skipped
    s.append_floats(kFloats.data() + 2, 4);
    s.append_floats(kFloats.data(), 6);
    s.append_ints(kInts.data(), 1);
    s.append_ints(kInts.data() + 1, 5);
    s.append_ints(kInts.data(), 3);
    CHECK_FALSE(fs::exists(dir / "streamed.safetensors"));  // in place only on commit
    s.commit();
  }
  CHECK(slurp(dir / "whole.safetensors") == slurp(dir / "streamed.safetensors"));

  write_npy(dir / "whole.npy", TensorToWrite::of_floats("x", {2, 3}, kFloats.data(), DType::F16));
  {
    TensorFileStream s(dir / "streamed.npy", {{"x", {2, 3}, DType::F16}});
    s.append_floats(kFloats.data(), 3);
    s.append_floats(kFloats.data() + 3, 3);
    s.commit();
  }
  CHECK(slurp(dir / "whole.npy") == slurp(dir / "streamed.npy"));
  // Zeros, and an explicit format whatever the name.
  {
    TensorFileStream s(dir / "zeros.bin", {{"z", {2, 2}, DType::F32}}, {}, TensorFileFormat::Safetensors);
    s.append_zeros(4);
    s.commit();
  }
  CHECK(TensorStore::open(dir / "zeros.bin")->read_f32("z").data == std::vector<float>(4, 0.0f));
}

TEST_CASE("TensorFileStream: a tensor overrun, a missing value or an F16 overflow is an error; nothing is left") {
  const fs::path dir = scratch_dir("writer_stream_errors");
  std::string msg = error_of([&] {
    TensorFileStream s(dir / "a.safetensors", {{"a", {2}, DType::F32}, {"b", {1}, DType::F32}});
    s.append_floats(kFloats.data(), 3);  // spans two tensors
  });
  CHECK(has(msg, "tensor 'a': 3 values appended, 2 of its 2 remain"));
  msg = error_of([&] {
    TensorFileStream s(dir / "b.safetensors", {{"a", {2}, DType::F32}, {"b", {3}, DType::F32}});
    s.append_floats(kFloats.data(), 2);
    s.append_floats(kFloats.data(), 1);
    s.commit();
  });
  CHECK(has(msg, "tensor 'b' got 1 of its 3 values"));
  msg = error_of([&] {
    TensorFileStream s(dir / "c.safetensors", {{"a", {2}, DType::I64}});
    s.append_floats(kFloats.data(), 2);
  });
  CHECK(has(msg, "float values appended to a I64 tensor"));
  const std::vector<float> big = {1.0f, 2.0f, -1e5f};
  msg = error_of([&] {
    TensorFileStream s(dir / "d.safetensors", {{"k", {3}, DType::F16}});
    s.append_floats(big.data(), 2);
    s.append_floats(big.data() + 2, 1);
  });
  CHECK(has(msg, "d.safetensors: tensor 'k': value -1e+05 at flat index 2 overflows F16"));
  msg = error_of([&] { TensorFileStream s(dir / "e.txt", {{"a", {1}, DType::F32}}); });
  CHECK(has(msg, "unknown output extension '.txt'"));
  CHECK(fs::directory_iterator(dir) == fs::directory_iterator());
}
