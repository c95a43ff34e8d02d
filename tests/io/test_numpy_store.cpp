// TensorStore over NumPy files: .npy (format 1.0/2.0/3.0, every supported dtype,
// Fortran order), directories of .npy files and .npz archives (stored, deflated,
// zip64), each against hand-built images and against files NumPy itself wrote
// (tests/data/numpy, see make_fixtures.py there), plus the error cases.
#include <algorithm>
#include <cmath>

#include "io_test_files.h"
#include "sim/core/half.h"
#include "sim/io/tensor_store.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

fs::path numpy_fixture(const std::string& name) { return source_dir() / "tests/data/numpy" / name; }

// a = arange(24).reshape(2, 3, 4) / 8 - 1, as in make_fixtures.py
std::vector<float> arange_a() {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) / 8.0f - 1.0f;
  return v;
}
const std::vector<int64_t> kIds = {-7, 993, 1993, 2993, 3993};  // arange(5) * 1000 - 7

// Column-major bytes of a row-major [2, 3, 4] array.
std::vector<float> to_fortran_234(const std::vector<float>& c) {
  std::vector<float> f(24);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) f[static_cast<size_t>(i + 2 * j + 6 * k)] = c[static_cast<size_t>(i * 12 + j * 4 + k)];
  return f;
}

}  // namespace

TEST_CASE("npy: every supported dtype") {
  const fs::path dir = scratch_dir("npy_dtypes");
  const std::vector<float> vals = {-2.5f, 0.125f, 1e-3f, 300.0f};
  const std::vector<double> vals64 = {-2.5, 0.125, 1.0 / 3.0, 1e30};
  struct Case {
    std::string file, descr;
    Bytes data;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"f4.npy", "<f4", raw_bytes(vals), DType::F32},
      {"f2.npy", "<f2", f16_bytes(vals), DType::F16},
      {"f8.npy", "<f8", raw_bytes(vals64), DType::F64},
      {"i4.npy", "<i4", raw_bytes(std::vector<int32_t>{-5, 0, 7, 2000000000}), DType::I32},
      {"i8.npy", "<i8", raw_bytes(std::vector<int64_t>{-5, 0, 7, 5000000000LL}), DType::I64},
      {"i2.npy", "<i2", raw_bytes(std::vector<int16_t>{-5, 0, 7, 30000}), DType::I16},
      {"u1.npy", "|u1", raw_bytes(std::vector<uint8_t>{5, 0, 7, 250}), DType::U8},
      {"i1.npy", "|i1", raw_bytes(std::vector<int8_t>{-5, 0, 7, -128}), DType::I8},
      {"b1.npy", "|b1", raw_bytes(std::vector<uint8_t>{1, 0, 1, 1}), DType::BOOL},
  };
  for (const Case& c : cases) {
    CAPTURE(c.file);
    write_bytes(dir / c.file, npy_image(c.descr, {2, 2}, c.data));
    const auto store = TensorStore::open(dir / c.file);
    const std::string name = fs::path(c.file).stem().string();
    REQUIRE(store->list().size() == 1);
    CHECK(store->list()[0].name == name);
    CHECK(store->info(name).dtype == c.dtype);
    CHECK(store->info(name).shape == std::vector<int64_t>{2, 2});
    CHECK(store->metadata().empty());
    const Tensor t = store->read_f32(name);
    CHECK(t.shape == std::vector<int64_t>{2, 2});
    if (c.dtype == DType::F32) CHECK(t.data == vals);
    if (c.dtype == DType::F16)
      for (size_t i = 0; i < 4; ++i) CHECK(t.data[i] == round_to_f16(vals[i]));
    if (c.dtype == DType::F64)
      for (size_t i = 0; i < 4; ++i) CHECK(t.data[i] == static_cast<float>(vals64[i]));
    if (c.dtype == DType::I64) CHECK(store->read_i64(name) == std::vector<int64_t>{-5, 0, 7, 5000000000LL});
    if (c.dtype == DType::I32) CHECK(store->read_i64(name) == std::vector<int64_t>{-5, 0, 7, 2000000000});
    if (c.dtype == DType::I16) CHECK(store->read_i64(name) == std::vector<int64_t>{-5, 0, 7, 30000});
    if (c.dtype == DType::U8) CHECK(store->read_i64(name) == std::vector<int64_t>{5, 0, 7, 250});
    if (c.dtype == DType::I8) CHECK(store->read_i64(name) == std::vector<int64_t>{-5, 0, 7, -128});
    if (c.dtype == DType::BOOL) CHECK(t.data == std::vector<float>{1, 0, 1, 1});
  }
  CHECK(has(error_of([&] { TensorStore::open(dir / "f4.npy")->read_i64("f4"); }), "float dtype F32"));
}

TEST_CASE("npy: Fortran order is transposed to row-major; header versions 2.0 and 3.0") {
  const fs::path dir = scratch_dir("npy_order");
  const std::vector<float> a = arange_a();
  write_bytes(dir / "fortran.npy", npy_image("<f4", {2, 3, 4}, raw_bytes(to_fortran_234(a)), true));
  const Tensor t = TensorStore::open(dir / "fortran.npy")->read_f32("fortran");
  CHECK(t.shape == std::vector<int64_t>{2, 3, 4});
  CHECK(t.data == a);

  std::vector<int32_t> fi(24);
  const std::vector<float> f = to_fortran_234(a);
  for (size_t i = 0; i < 24; ++i) fi[i] = static_cast<int32_t>(f[i] * 8);
  write_bytes(dir / "fortran_int.npy", npy_image("<i4", {2, 3, 4}, raw_bytes(fi), true));
  const std::vector<int64_t> ints = TensorStore::open(dir / "fortran_int.npy")->read_i64("fortran_int");
  for (size_t i = 0; i < 24; ++i) CHECK(ints[i] == static_cast<int64_t>(a[i] * 8));

  write_bytes(dir / "v2.npy", npy_image("<f4", {24}, raw_bytes(a), false, 2));
  write_bytes(dir / "v3.npy", npy_image("<f4", {4, 6}, raw_bytes(a), false, 3));
  CHECK(TensorStore::open(dir / "v2.npy")->read_f32("v2").data == a);
  CHECK(TensorStore::open(dir / "v3.npy")->read_f32("v3").shape == std::vector<int64_t>{4, 6});
  write_bytes(dir / "scalar.npy", npy_image("<f8", {}, raw_bytes(std::vector<double>{0.75})));
  const Tensor s = TensorStore::open(dir / "scalar.npy")->read_f32("scalar");
  CHECK(s.shape.empty());
  CHECK(s.data == std::vector<float>{0.75f});
  // An F64 value beyond fp32's range is an error, not a silent Inf.
  write_bytes(dir / "big.npy", npy_image("<f8", {3}, raw_bytes(std::vector<double>{1.0, -1e300, 2.0})));
  CHECK_THROWS_WITH_AS(TensorStore::open(dir / "big.npy")->read_f32("big"),
                       doctest::Contains("tensor 'big': F64 value -1e+300 at storage index 1 is beyond fp32's range"),
                       Error);
}

TEST_CASE("npy: files written by NumPy") {
  const std::vector<float> a = arange_a();
  const Tensor fortran = TensorStore::open(numpy_fixture("fortran.npy"))->read_f32("fortran");
  CHECK(fortran.shape == std::vector<int64_t>{2, 3, 4});
  CHECK(fortran.data == a);
  const auto half = TensorStore::open(numpy_fixture("half.npy"));
  CHECK(half->info("half").dtype == DType::F16);
  CHECK(half->read_f32("half").data == a);  // multiples of 1/8 are exact in fp16
  const auto v2 = TensorStore::open(numpy_fixture("v2.npy"));
  CHECK(v2->info("v2").dtype == DType::F64);
  CHECK(v2->read_f32("v2").data == a);
  const auto v3 = TensorStore::open(numpy_fixture("v3.npy"));
  CHECK(v3->info("v3").dtype == DType::I32);
  CHECK(v3->read_i64("v3") == kIds);
  CHECK(TensorStore::open(numpy_fixture("bool.npy"))->read_i64("bool") == std::vector<int64_t>{1, 0, 1});

  const std::string msg = error_of([] { TensorStore::open(numpy_fixture("big_endian.npy")); });
  CHECK(has(msg, "big_endian.npy"));
  CHECK(has(msg, "big-endian dtype '>f4' is not supported"));
}

TEST_CASE("npy: errors name the file") {
  const fs::path dir = scratch_dir("npy_errors");
  const std::vector<float> vals = {1, 2, 3, 4, 5, 6};
  const Bytes good = npy_image("<f4", {2, 3}, raw_bytes(vals));
  auto open_error = [&](const std::string& file, const Bytes& b) {
    write_bytes(dir / file, b);
    const std::string msg = error_of([&] { TensorStore::open(dir / file); });
    CHECK(has(msg, file));
    return msg;
  };
  CHECK(has(open_error("cut.npy", Bytes(good.begin(), good.end() - 3)), "truncated .npy"));
  CHECK(has(open_error("cut_header.npy", Bytes(good.begin(), good.begin() + 30)), "header needs 128 bytes, the file has 30"));
  CHECK(has(open_error("tiny.npy", Bytes(good.begin(), good.begin() + 4)), "truncated .npy: 4 bytes"));
  Bytes magic = good;
  magic[1] = 'X';
  CHECK(has(open_error("magic.npy", magic), "no \\x93NUMPY magic"));
  Bytes version = good;
  version[6] = 9;
  CHECK(has(open_error("version.npy", version), "unsupported .npy format version 9.0"));
  CHECK(has(open_error("complex.npy", npy_image("<c8", {2}, Bytes(16))), "unsupported dtype '<c8'"));
  CHECK(has(open_error("u2.npy", npy_image("<u2", {2}, Bytes(4))), "unsupported dtype '<u2'"));
  CHECK(has(open_error("big.npy", npy_image(">i4", {2}, Bytes(8))), "big-endian dtype '>i4'"));
  // Structured dtypes have a list as descr.
  const std::string dict = "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2,), }\n";
  Bytes structured = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size()), 0};
  structured.insert(structured.end(), dict.begin(), dict.end());
  structured.resize(structured.size() + 8);
  CHECK(has(open_error("structured.npy", structured), "structured or record dtype"));
  const std::string bad_dict = "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }\n";
  Bytes bad = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(bad_dict.size()), 0};
  bad.insert(bad.end(), bad_dict.begin(), bad_dict.end());
  bad.resize(bad.size() + 8);
  CHECK(has(open_error("bad_dict.npy", bad), "fortran_order must be True or False"));
  const std::string no_shape = "{'descr': '<f4', 'fortran_order': False}\n";
  Bytes ns = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(no_shape.size()), 0};
  ns.insert(ns.end(), no_shape.begin(), no_shape.end());
  const std::string ns_msg = open_error("no_shape.npy", ns);
  CHECK(has(ns_msg, "needs 'descr', 'fortran_order' and 'shape'; got \"{'descr': '<f4', 'fortran_order': False}\""));
  CHECK(ns_msg.find('\n') == std::string::npos);  // one line: the header's newline dropped

  write_bytes(dir / "ok.npy", good);
  const std::string missing = error_of([&] { TensorStore::open(dir / "ok.npy")->read_f32("okk"); });
  CHECK(has(missing, "ok.npy"));
  CHECK(has(missing, "no tensor 'okk' (did you mean 'ok'?)"));
}

TEST_CASE("directory of .npy files: one tensor per file, named after the stem") {
  const fs::path dir = scratch_dir("npy_dir");
  const std::vector<float> a = arange_a();
  write_bytes(dir / "layers.0.query.npy", npy_image("<f4", {2, 3, 4}, raw_bytes(a)));
  write_bytes(dir / "layers.0.key.npy", npy_image("<f2", {24}, f16_bytes(a)));
  write_bytes(dir / "input_ids.npy", npy_image("<i8", {5}, raw_bytes(kIds)));
  write_bytes(dir / "README.txt", Bytes{'x'});  // other files are ignored
  const auto store = TensorStore::open(dir);
  const auto list = store->list();
  REQUIRE(list.size() == 3);
  CHECK(list[0].name == "input_ids");
  CHECK(list[1].name == "layers.0.key");
  CHECK(fs::path(list[2].file).filename() == "layers.0.query.npy");
  CHECK(store->read_f32("layers.0.query").data == a);
  CHECK(store->read_f32("layers.0.key").data == a);
  CHECK(store->read_i64("input_ids") == kIds);

  const fs::path empty = scratch_dir("npy_dir_empty");
  CHECK(has(error_of([&] { TensorStore::open(empty); }), "neither model.safetensors.index.json nor *.npy"));
  write_bytes(dir / "broken.npy", Bytes{0x93, 'N', 'U'});
  const std::string msg = error_of([&] { TensorStore::open(dir); });
  CHECK(has(msg, "broken.npy"));
}

TEST_CASE("npz: stored, deflated and zip64 members") {
  const fs::path dir = scratch_dir("npz");
  const std::vector<float> a = arange_a();
  const Bytes a_npy = npy_image("<f4", {2, 3, 4}, raw_bytes(a));
  const Bytes ids_npy = npy_image("<i8", {5}, raw_bytes(kIds));
  const Bytes h_npy = npy_image("<f2", {3, 8}, f16_bytes(a), false, 2);
  for (const bool deflate : {false, true})
    for (const bool zip64 : {false, true}) {
      CAPTURE(deflate);
      CAPTURE(zip64);
      const fs::path p = dir / (std::string(deflate ? "deflated" : "stored") + (zip64 ? "_zip64" : "") + ".npz");
      write_bytes(p, zip_image({{"a.npy", a_npy, deflate},
                                {"ids.npy", ids_npy, deflate},
                                {"sub/half.npy", h_npy, !deflate},
                                {"notes.txt", Bytes{'h', 'i'}, false}},
                               zip64));
      const auto store = TensorStore::open(p);
      const auto list = store->list();
      REQUIRE(list.size() == 3);  // notes.txt is not an array
      CHECK(list[0].name == "a");
      CHECK(list[2].name == "sub/half");
      CHECK(list[0].file == p.string());
      CHECK(store->read_f32("a").data == a);
      CHECK(store->read_i64("ids") == kIds);
      CHECK(store->info("sub/half").shape == std::vector<int64_t>{3, 8});
      CHECK(store->read_f32("sub/half").data == a);
    }
  // A header longer than the first inflated chunk (4096 bytes) is inflated in full.
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }";
  dict += std::string(5000, ' ') + "\n";
  Bytes long_header = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
  put_le(long_header, dict.size(), 4);
  long_header.insert(long_header.end(), dict.begin(), dict.end());
  const Bytes raw = raw_bytes(a);
  long_header.insert(long_header.end(), raw.begin(), raw.end());
  write_bytes(dir / "long_header.npz", zip_image({{"x.npy", long_header, true}}));
  CHECK(TensorStore::open(dir / "long_header.npz")->read_f32("x").data == a);
}

TEST_CASE("npz: files written by numpy.savez and savez_compressed") {
  for (const char* file : {"savez.npz", "savez_compressed.npz"}) {
    CAPTURE(file);
    const auto store = TensorStore::open(numpy_fixture(file));
    REQUIRE(store->list().size() == 2);
    CHECK(store->info("a").shape == std::vector<int64_t>{2, 3, 4});
    CHECK(store->read_f32("a").data == arange_a());
    CHECK(store->info("ids").dtype == DType::I64);
    CHECK(store->read_i64("ids") == kIds);
  }
}

TEST_CASE("npz: errors name the archive and the member") {
  const fs::path dir = scratch_dir("npz_errors");
  const Bytes a_npy = npy_image("<f4", {2, 3, 4}, raw_bytes(arange_a()));
  const Bytes stored = zip_image({{"a.npy", a_npy, false}});
  const Bytes deflated = zip_image({{"a.npy", a_npy, true}});

  SUBCASE("truncated archive: no end-of-central-directory record") {
    write_bytes(dir / "cut.npz", Bytes(stored.begin(), stored.begin() + 100));
    const std::string msg = error_of([&] { TensorStore::open(dir / "cut.npz"); });
    CHECK(has(msg, "cut.npz"));
    CHECK(has(msg, "no end-of-central-directory record"));
  }
  SUBCASE("CRC mismatch in a stored member") {
    Bytes bad = stored;
    bad[30 + 5 + 128 + 10] ^= 0x40;  // a data byte of a.npy (local header 30, name 5, npy header 128)
    write_bytes(dir / "crc.npz", bad);
    // Found when opening (a member this small is inflated whole for its header) or reading.
    const std::string msg = error_of([&] { TensorStore::open(dir / "crc.npz")->read_f32("a"); });
    CHECK(has(msg, "crc.npz"));
    CHECK(has(msg, "member 'a.npy'"));
    CHECK(has(msg, "CRC-32 mismatch"));
  }
  SUBCASE("corrupt deflate stream") {
    Bytes bad = deflated;
    for (size_t i = 35; i < 60; ++i) bad[i] = 0xff;
    write_bytes(dir / "corrupt.npz", bad);
    const std::string msg = error_of([&] { TensorStore::open(dir / "corrupt.npz")->read_f32("a"); });
    CHECK(has(msg, "corrupt.npz"));
    CHECK(has(msg, "member 'a.npy'"));
  }
  SUBCASE("unsupported compression method") {
    Bytes bad = stored;
    const size_t central = stored.size() - 22 - 21 - (46 + 5 + 8);  // EOCD, comment, one central entry
    REQUIRE(bad[central] == 0x50);
    bad[central + 10] = 14;  // LZMA
    write_bytes(dir / "lzma.npz", bad);
    const std::string msg = error_of([&] { TensorStore::open(dir / "lzma.npz"); });
    CHECK(has(msg, "member 'a.npy'"));
    CHECK(has(msg, "unsupported compression method 14"));
  }
  SUBCASE("a member claiming more than deflate can expand to (refused before allocating it)") {
    Bytes bad = deflated;
    const size_t central = deflated.size() - 22 - 21 - (46 + 5 + 8);
    REQUIRE(bad[central] == 0x50);
    for (int i = 0; i < 4; ++i) bad[central + 24 + i] = i == 3 ? 0x7f : 0xf0;  // uncompressed size ~2 GiB
    write_bytes(dir / "claims.npz", bad);
    const std::string msg = error_of([&] { TensorStore::open(dir / "claims.npz"); });
    CHECK(has(msg, "claims.npz"));
    CHECK(has(msg, "member 'a.npy' claims 2146496752 uncompressed bytes"));
    CHECK(has(msg, "deflate expands at most 1032:1"));
  }
  SUBCASE("a member of another method (bzip2, LZMA) that is not an array is skipped, as np.load does") {
    Bytes mixed = zip_image({{"a.npy", a_npy, true}, {"notes.txt", Bytes(64, 'x'), false}});
    const uint8_t sig[4] = {0x50, 0x4b, 0x01, 0x02};
    const auto first = std::search(mixed.begin(), mixed.end(), sig, sig + 4);
    const auto second = std::search(first + 4, mixed.end(), sig, sig + 4);
    REQUIRE(second != mixed.end());
    const size_t at = static_cast<size_t>(second - mixed.begin());
    mixed[at + 10] = 14;                                                     // LZMA
    for (int i = 0; i < 4; ++i) mixed[at + 24 + i] = i == 2 ? 0x98 : 0x00;  // 10 MB from 64 bytes
    write_bytes(dir / "mixed.npz", mixed);
    const auto store = TensorStore::open(dir / "mixed.npz");
    CHECK(store->list().size() == 1);
    CHECK(store->read_f32("a").numel() == 24);
  }
  SUBCASE("an end record counting fewer entries than the directory holds") {
    Bytes bad = stored;
    const size_t eocd = stored.size() - 22 - 21;
    REQUIRE(bad[eocd] == 0x50);
    bad[eocd + 8] = bad[eocd + 10] = 0;  // 0 entries on this disk, 0 in all
    write_bytes(dir / "zero.npz", bad);
    const std::string msg = error_of([&] { TensorStore::open(dir / "zero.npz"); });
    CHECK(has(msg, "zero.npz"));
    CHECK(has(msg, "holds more than the 0 entries its end record counts"));
  }
  SUBCASE("encrypted member") {
    Bytes bad = stored;
    const size_t central = stored.size() - 22 - 21 - (46 + 5 + 8);
    bad[central + 8] = 1;
    write_bytes(dir / "secret.npz", bad);
    CHECK(has(error_of([&] { TensorStore::open(dir / "secret.npz"); }), "'a.npy' is encrypted"));
  }
  SUBCASE("member array truncated") {
    const Bytes short_npy(a_npy.begin(), a_npy.end() - 8);
    write_bytes(dir / "short.npz", zip_image({{"a.npy", short_npy, true}}));
    const std::string msg = error_of([&] { TensorStore::open(dir / "short.npz"); });
    CHECK(has(msg, "short.npz: member 'a.npy'"));
    CHECK(has(msg, "truncated array"));
  }
  SUBCASE("missing tensor") {
    write_bytes(dir / "ok.npz", stored);
    const std::string msg = error_of([&] { TensorStore::open(dir / "ok.npz")->info("b"); });
    CHECK(has(msg, "ok.npz"));
    CHECK(has(msg, "no tensor 'b'"));
  }
}
