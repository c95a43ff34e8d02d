// TensorStore over safetensors files and Hugging Face sharded checkpoints: every dtype,
// metadata, every structural error, lazily opened shards, and values of the bundled
// fixtures (expected values computed offline with numpy from the raw files).
#include <sys/stat.h>

#include <cmath>
#include <numeric>

#include "io_test_files.h"
#include "sim/core/half.h"
#include "sim/io/json_file.h"
#include "sim/io/tensor_store.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

const std::vector<float> kValues = {-1.5f, 0.0f, 0.333333f, 65504.0f, 1e-7f, -3.25e-3f};

fs::path write_safetensors(const fs::path& dir, const std::string& file, const std::vector<RawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {}) {
  const fs::path p = dir / file;
  write_bytes(p, safetensors_image(tensors, metadata));
  return p;
}

}  // namespace

TEST_CASE("safetensors: F32, F16, BF16 and F64 tensors read as fp32") {
  const fs::path dir = scratch_dir("st_floats");
  std::vector<double> f64(kValues.begin(), kValues.end());
  f64[2] = 1.0 / 3.0;
  const fs::path p = write_safetensors(dir, "floats.safetensors",
                                       {{"a.f32", "F32", {2, 3}, raw_bytes(kValues)},
                                        {"b.f16", "F16", {3, 2}, f16_bytes(kValues)},
                                        {"c.bf16", "BF16", {6}, bf16_bytes(kValues)},
                                        {"d.f64", "F64", {1, 6}, raw_bytes(f64)}});
  const auto store = TensorStore::open(p);
  CHECK(store->path() == p);
  const auto list = store->list();
  REQUIRE(list.size() == 4);
  CHECK(list[0].name == "a.f32");  // sorted by name
  CHECK(list[3].name == "d.f64");

  const Tensor a = store->read_f32("a.f32");
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.data == kValues);
  const Tensor b = store->read_f32("b.f16");
  CHECK(b.shape == std::vector<int64_t>{3, 2});
  const Tensor c = store->read_f32("c.bf16");
  const Tensor d = store->read_f32("d.f64");
  for (size_t i = 0; i < kValues.size(); ++i) {
    CHECK(b.data[i] == round_to_f16(kValues[i]));
    CHECK(c.data[i] == round_to_bf16(kValues[i]));
    CHECK(d.data[i] == static_cast<float>(f64[i]));
  }
  CHECK(store->info("b.f16").dtype == DType::F16);
  CHECK(store->info("c.bf16").dtype == DType::BF16);
  CHECK(store->info("d.f64").file == p.string());
  CHECK(dtype_name(DType::BF16) == std::string("BF16"));
  CHECK(dtype_bytes(DType::F64) == 8);
}

TEST_CASE("safetensors: integer dtypes, unaligned data, scalars and empty tensors") {
  const fs::path dir = scratch_dir("st_ints");
  const std::vector<uint8_t> u8 = {0, 7, 255};  // 3 bytes first: every later tensor is unaligned
  const std::vector<int32_t> i32 = {-2147483647 - 1, -1, 0, 2147483647};
  const std::vector<int64_t> i64 = {-9000000000LL, 42};
  const std::vector<int8_t> i8 = {-128, 127};
  const std::vector<int16_t> i16 = {-32768, 12345};
  const std::vector<uint8_t> flags = {1, 0, 1};
  const fs::path p = write_safetensors(dir, "ints.safetensors",
                                       {{"u8", "U8", {3}, raw_bytes(u8)},
                                        {"i32", "I32", {2, 2}, raw_bytes(i32)},
                                        {"i64", "I64", {2}, raw_bytes(i64)},
                                        {"i8", "I8", {2}, raw_bytes(i8)},
                                        {"i16", "I16", {2}, raw_bytes(i16)},
                                        {"flags", "BOOL", {3}, raw_bytes(flags)},
                                        {"scalar", "F32", {}, raw_bytes(std::vector<float>{2.5f})},
                                        {"empty", "F16", {0, 4}, {}},
                                        {"f32_unaligned", "F32", {6}, raw_bytes(kValues)}});
  const auto store = TensorStore::open(p);
  CHECK(store->read_i64("u8") == std::vector<int64_t>{0, 7, 255});
  CHECK(store->read_i64("i32") == std::vector<int64_t>{-2147483648LL, -1, 0, 2147483647});
  CHECK(store->read_i64("i64") == std::vector<int64_t>{-9000000000LL, 42});
  CHECK(store->read_i64("i8") == std::vector<int64_t>{-128, 127});
  CHECK(store->read_i64("i16") == std::vector<int64_t>{-32768, 12345});
  CHECK(store->read_i64("flags") == std::vector<int64_t>{1, 0, 1});
  CHECK(store->read_f32("i32").data == std::vector<float>{-2147483648.0f, -1.0f, 0.0f, 2147483647.0f});
  CHECK(store->read_f32("f32_unaligned").data == kValues);

  const Tensor s = store->read_f32("scalar");
  CHECK(s.shape.empty());
  CHECK(s.data == std::vector<float>{2.5f});
  const Tensor e = store->read_f32("empty");
  CHECK(e.shape == std::vector<int64_t>{0, 4});
  CHECK(e.numel() == 0);

  const std::string msg = error_of([&] { store->read_i64("f32_unaligned"); });
  CHECK(has(msg, "ints.safetensors"));
  CHECK(has(msg, "'f32_unaligned'"));
  CHECK(has(msg, "float dtype F32"));
}

TEST_CASE("safetensors: metadata, missing tensors, and content sniffing") {
  const fs::path dir = scratch_dir("st_meta");
  const fs::path p = write_safetensors(dir, "meta.safetensors",
                                       {f32_tensor("layers.0.query", {2}, {1, 2}), f32_tensor("layers.0.key", {2}, {3, 4})},
                                       {{"model", "tiny"}, {"rope_theta", "500000"}});
  const auto store = TensorStore::open(p);
  const auto md = store->metadata();
  CHECK(md.size() == 2);
  CHECK(md.at("model") == "tiny");
  CHECK(md.at("rope_theta") == "500000");
  CHECK(store->contains("layers.0.key"));
  CHECK_FALSE(store->contains("layers.0.value"));

  const std::string msg = error_of([&] { store->read_f32("layers.0.kye"); });
  CHECK(has(msg, "meta.safetensors"));
  CHECK(has(msg, "no tensor 'layers.0.kye'"));
  CHECK(has(msg, "did you mean 'layers.0.key'"));
  CHECK(has(msg, "'layers.0.query'"));  // nearest names listed
  CHECK(has(error_of([&] { store->info("nothing"); }), "no tensor 'nothing'"));

  // A safetensors file without the extension is recognised by its content.
  fs::copy_file(p, dir / "meta.bin");
  CHECK(TensorStore::open(dir / "meta.bin")->read_f32("layers.0.key").data == std::vector<float>{3, 4});

  CHECK(has(error_of([&] { TensorStore::open(dir / "absent.safetensors"); }), "absent.safetensors: no such file"));
  write_bytes(dir / "notes.txt", {'h', 'e', 'l', 'l', 'o', '\n', 'w', 'o', 'r', 'l', 'd'});
  CHECK(has(error_of([&] { TensorStore::open(dir / "notes.txt"); }), "unknown tensor file type"));
}

TEST_CASE("safetensors: structural errors name the file and the tensor") {
  const fs::path dir = scratch_dir("st_errors");
  const std::vector<RawTensor> good = {f32_tensor("alpha", {2, 3}, {1, 2, 3, 4, 5, 6}),
                                       f32_tensor("beta", {2}, {7, 8})};
  const Bytes image = safetensors_image(good);
  auto write_and_open = [&](const std::string& name, const Bytes& bytes) {
    write_bytes(dir / name, bytes);
    return error_of([&] { TensorStore::open(dir / name); });
  };

  SUBCASE("truncated before the header length") {
    const std::string msg = write_and_open("tiny.safetensors", Bytes(image.begin(), image.begin() + 5));
    CHECK(has(msg, "tiny.safetensors"));
    CHECK(has(msg, "truncated: 5 bytes"));
  }
  SUBCASE("header length beyond the file") {
    const std::string msg = write_and_open("cut_header.safetensors", Bytes(image.begin(), image.begin() + 40));
    CHECK(has(msg, "cut_header.safetensors"));
    CHECK(has(msg, "extends beyond the file (40 bytes"));
  }
  SUBCASE("data cut off: offsets out of range") {
    const std::string msg = write_and_open("cut_data.safetensors", Bytes(image.begin(), image.end() - 4));
    CHECK(has(msg, "cut_data.safetensors"));
    CHECK(has(msg, "tensor 'beta'"));
    CHECK(has(msg, "out of range"));
  }
  SUBCASE("offsets beyond the data section") {
    const std::string h =
        R"({"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"beta":{"dtype":"F32","shape":[2],"data_offsets":[24,4000]}})";
    const std::string msg = write_and_open("range.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "range.safetensors"));
    CHECK(has(msg, "tensor 'beta'"));
    CHECK(has(msg, "[24,4000] out of range: the data section holds 32 bytes"));
  }
  SUBCASE("offsets not matching shape x dtype") {
    const std::string h =
        R"({"alpha":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]},"beta":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
    const std::string msg = write_and_open("size.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "tensor 'alpha'"));
    CHECK(has(msg, "span 24 bytes, but shape [2, 2] x F32 (4 bytes) needs 16"));
  }
  SUBCASE("overlapping tensors") {
    const std::string h =
        R"({"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"beta":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
    const std::string msg = write_and_open("overlap.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "overlap.safetensors"));
    CHECK(has(msg, "'alpha' [0, 24) and 'beta' [16, 24) overlap"));
  }
  SUBCASE("duplicate tensor name") {
    // JSON parsers keep one of the two entries; the file is ambiguous, not overlapping.
    const std::string h =
        R"({"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"beta":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},"alpha":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
    const std::string msg = write_and_open("dup.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "duplicate tensor name 'alpha' in the header of " + (dir / "dup.safetensors").string()));
    const std::string key =
        R"({"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"shape":[6]}})";
    const std::string kmsg = write_and_open("dupkey.safetensors", safetensors_image(good, {}, key));
    CHECK(has(kmsg, "dupkey.safetensors"));
    CHECK(has(kmsg, "duplicate key 'shape' in the header entry 'alpha'"));
  }
  SUBCASE("nesting deep enough to exhaust the stack when printed") {
    const std::string h = R"({"__metadata__":{"deep":)" + std::string(100000, '[') + std::string(100000, ']') +
                          R"(},"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
    const std::string msg = write_and_open("deep.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "deep.safetensors"));
    CHECK(has(msg, "JSON nests deeper than 64 levels"));
  }
  SUBCASE("a NUL byte inside the header (the parser would stop there)") {
    std::string h = R"({"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
    h = "{}" + std::string(1, '\0') + h.substr(2);
    const std::string msg = write_and_open("nul.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "nul.safetensors"));
    CHECK(has(msg, "a NUL byte at header offset 2"));
  }
  SUBCASE("begin after end") {
    const std::string h =
        R"({"alpha":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
    CHECK(has(write_and_open("reversed.safetensors", safetensors_image(good, {}, h)), "has begin > end"));
  }
  SUBCASE("unknown dtype") {
    const std::string h =
        R"({"alpha":{"dtype":"Q4_K","shape":[2,3],"data_offsets":[0,24]},"beta":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
    const std::string msg = write_and_open("dtype.safetensors", safetensors_image(good, {}, h));
    CHECK(has(msg, "dtype.safetensors"));
    CHECK(has(msg, "tensor 'alpha'"));
    CHECK(has(msg, "unknown dtype 'Q4_K'"));
    CHECK(has(msg, "BF16"));  // lists the known ones
  }
  SUBCASE("bad JSON") {
    const std::string msg = write_and_open("json.safetensors", safetensors_image(good, {}, R"({"alpha": {"dtype": )"));
    CHECK(has(msg, "json.safetensors"));
    CHECK(has(msg, "bad JSON header"));
  }
  SUBCASE("header not an object, entries malformed") {
    CHECK(has(write_and_open("array.safetensors", safetensors_image(good, {}, "[1, 2]")), "must be an object"));
    const std::string no_shape = R"({"alpha":{"dtype":"F32","data_offsets":[0,24]}})";
    CHECK(has(write_and_open("noshape.safetensors", safetensors_image(good, {}, no_shape)), "\"shape\""));
    const std::string neg = R"({"alpha":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}})";
    CHECK(has(write_and_open("neg.safetensors", safetensors_image(good, {}, neg)), "non-negative integers"));
    const std::string meta = R"({"__metadata__":[1],"alpha":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
    CHECK(has(write_and_open("meta.safetensors", safetensors_image(good, {}, meta)), "__metadata__"));
  }
  SUBCASE("the intact image opens") {
    write_bytes(dir / "good.safetensors", image);
    CHECK(TensorStore::open(dir / "good.safetensors")->read_f32("beta").data == std::vector<float>{7, 8});
  }
}

TEST_CASE("inputs that are not regular files are refused by name, without blocking on a FIFO") {
  const fs::path dir = scratch_dir("st_not_regular");
  // A FIFO with no writer: opening it for reading would block forever.
  for (const std::string name : {"pipe.safetensors", "pipe.npy", "pipe", "model.safetensors.index.json"}) {
    CAPTURE(name);
    REQUIRE(::mkfifo((dir / name).c_str(), 0600) == 0);
    CHECK(has(error_of([&] { TensorStore::open(dir / name); }),
              (dir / name).string() + ": is a FIFO (named pipe), not a regular file; a "));
    fs::remove(dir / name);
  }
  // A directory whose index or .npy file is a FIFO.
  fs::create_directories(dir / "sharded");
  REQUIRE(::mkfifo((dir / "sharded" / "model.safetensors.index.json").c_str(), 0600) == 0);
  CHECK(has(error_of([&] { TensorStore::open(dir / "sharded"); }), "index.json: is a FIFO (named pipe)"));
  fs::create_directories(dir / "npys");
  REQUIRE(::mkfifo((dir / "npys" / "a.npy").c_str(), 0600) == 0);
  CHECK(has(error_of([&] { TensorStore::open(dir / "npys")->list(); }), "a.npy: is a FIFO (named pipe)"));
  // A device that never ends, and a JSON file that is a FIFO.
  CHECK(has(error_of([&] { TensorStore::open("/dev/zero"); }), "/dev/zero: is a character device, not a regular file"));
  REQUIRE(::mkfifo((dir / "config.json").c_str(), 0600) == 0);
  CHECK(has(error_of([&] { read_json_object(dir / "config.json", "a checkpoint's config.json"); }),
            "config.json: is a FIFO (named pipe), not a regular file; a checkpoint's config.json must be a regular file"));
}

TEST_CASE("JSON nesting: kMaxJsonDepth levels of arrays or objects parse, one more is refused") {
  // `levels` containers one inside the other, `inner` in the deepest.
  const auto nested_arrays = [](int levels, const std::string& inner) {
    return std::string(levels, '[') + inner + std::string(levels, ']');
  };
  const auto nested_objects = [](int levels, const std::string& inner) {
    std::string text;
    for (int i = 0; i + 1 < levels; ++i) text += R"({"a":)";
    return text + "{" + (inner.empty() ? "" : R"("b":)" + inner) + std::string(levels, '}');
  };
  const auto ignore = [](const std::string&, const std::string&) {};
  using Nested = std::function<std::string(int, const std::string&)>;
  for (const Nested& nested : {Nested(nested_arrays), Nested(nested_objects)}) {
    CHECK_NOTHROW(parse_json_checking_duplicates(nested(kMaxJsonDepth, ""), ignore));
    // A scalar inside the deepest container is not a level of its own.
    CHECK_NOTHROW(parse_json_checking_duplicates(nested(kMaxJsonDepth, "1"), ignore));
    CHECK_THROWS_AS(parse_json_checking_duplicates(nested(kMaxJsonDepth + 1, ""), ignore), JsonTooDeep);
  }
}

TEST_CASE("sharded safetensors: index file or directory, shards opened lazily") {
  const fs::path dir = scratch_dir("sharded");
  write_safetensors(dir, "model-00001-of-00002.safetensors",
                    {f32_tensor("embed.weight", {2, 2}, {1, 2, 3, 4}), f32_tensor("layers.0.w", {3}, {5, 6, 7})},
                    {{"format", "pt"}});
  write_safetensors(dir, "model-00002-of-00002.safetensors",
                    {{"head.weight", "F16", {2}, f16_bytes({0.5f, -0.25f})}, f32_tensor("layers.1.w", {1}, {9})},
                    {{"format", "pt"}});
  const std::string index = R"({"metadata": {"total_size": 44, "note": "hand-built"},
    "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                   "layers.0.w": "model-00001-of-00002.safetensors",
                   "head.weight": "model-00002-of-00002.safetensors",
                   "layers.1.w": "model-00002-of-00002.safetensors"}})";
  const Bytes index_bytes(index.begin(), index.end());
  write_bytes(dir / "model.safetensors.index.json", index_bytes);

  for (const fs::path& p : {dir, dir / "model.safetensors.index.json"}) {
    CAPTURE(p);
    const auto store = TensorStore::open(p);
    const auto list = store->list();
    REQUIRE(list.size() == 4);
    CHECK(list[0].name == "embed.weight");
    CHECK(fs::path(list[0].file).filename() == "model-00001-of-00002.safetensors");
    CHECK(fs::path(store->info("head.weight").file).filename() == "model-00002-of-00002.safetensors");
    CHECK(store->info("head.weight").dtype == DType::F16);
    CHECK(store->read_f32("head.weight").data == std::vector<float>{0.5f, -0.25f});
    CHECK(store->read_f32("layers.0.w").data == std::vector<float>{5, 6, 7});
    CHECK(store->metadata().at("total_size") == "44");
    CHECK(store->metadata().at("note") == "hand-built");
    CHECK(store->contains("layers.1.w"));
    const std::string msg = error_of([&] { store->read_f32("layers.2.w"); });
    CHECK(has(msg, "model.safetensors.index.json"));
    CHECK(has(msg, "no tensor 'layers.2.w'"));
  }

  // Lazy: a broken second shard does not stop reads from the first.
  const fs::path shard2 = dir / "model-00002-of-00002.safetensors";
  write_bytes(shard2, Bytes{1, 2, 3});
  const auto store = TensorStore::open(dir);
  CHECK(store->read_f32("embed.weight").data == std::vector<float>{1, 2, 3, 4});
  const std::string broken = error_of([&] { store->read_f32("layers.1.w"); });
  CHECK(has(broken, "model-00002-of-00002.safetensors"));
  CHECK(has(broken, "truncated"));

  // The weight map claims a tensor the shard does not hold.
  write_safetensors(dir, "model-00002-of-00002.safetensors", {f32_tensor("layers.1.w", {1}, {9})});
  const std::string misplaced = error_of([&] { TensorStore::open(dir)->read_f32("head.weight"); });
  CHECK(has(misplaced, "places tensor 'head.weight' in this shard"));

  // A shard named in the weight map that does not exist is reported when opening.
  fs::remove(shard2);
  const std::string missing = error_of([&] { TensorStore::open(dir); });
  CHECK(has(missing, "model.safetensors.index.json"));
  CHECK(has(missing, "shard file 'model-00002-of-00002.safetensors'"));

  const std::string bad = "{\"weight_map\": {\"a\": ";
  write_bytes(dir / "model.safetensors.index.json", Bytes(bad.begin(), bad.end()));
  CHECK(has(error_of([&] { TensorStore::open(dir); }), "bad JSON in sharded checkpoint index"));
  const std::string dup = R"({"weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
    "embed.weight": "model-00002-of-00002.safetensors"}})";
  write_bytes(dir / "model.safetensors.index.json", Bytes(dup.begin(), dup.end()));
  CHECK(has(error_of([&] { TensorStore::open(dir); }),
            "duplicate tensor name 'embed.weight' in the weight_map of " + (dir / "model.safetensors.index.json").string()));
  for (const std::string shard_name : {"/etc/passwd", "../model-00001-of-00002.safetensors", "sub/x.safetensors"}) {
    const std::string outside = R"({"weight_map": {"embed.weight": ")" + shard_name + R"("}})";
    write_bytes(dir / "model.safetensors.index.json", Bytes(outside.begin(), outside.end()));
    CHECK(has(error_of([&] { TensorStore::open(dir); }), "weight_map entry 'embed.weight' names shard '" + shard_name +
                                                             "': a shard must be a file name in the index's directory"));
  }
  const std::string no_map = "{\"metadata\": {}}";
  write_bytes(dir / "model.safetensors.index.json", Bytes(no_map.begin(), no_map.end()));
  CHECK(has(error_of([&] { TensorStore::open(dir); }), "no \"weight_map\""));
}

// ---- bundled fixtures (values from numpy on the raw files) ---------------------------

// data/reference/NAME-record-slice.safetensors: the first 128 tokens of two layers of
// Hugging Face's recordings (data/SOURCES.md).
TEST_CASE("fixture: gpt2-bytes recording file") {
  const auto store = TensorStore::open(data_dir() / "reference/gpt2-bytes-record-slice.safetensors");
  CHECK(store->list().size() == 9);  // 2 layers x query, key, value, attn_output + input_ids
  const TensorInfo& q = store->info("layers.0.query");
  CHECK(q.dtype == DType::F16);
  CHECK(q.shape == std::vector<int64_t>{6, 128, 64});
  CHECK(store->info("layers.5.attn_output").shape == std::vector<int64_t>{128, 384});
  CHECK(store->info("input_ids").dtype == DType::I32);
  const auto md = store->metadata();
  CHECK(md.at("model") == "gpt2-bytes");
  CHECK(md.at("tokens") == "128");
  CHECK(md.at("rope") == "none");
  CHECK(md.at("slice") == "first 128 of 512 tokens, layers 0 and 5 of 0..5, values as recorded");
  CHECK(md.at("nll_mean_of_full_recording") == "0.861806");

  const Tensor q0 = store->read_f32("layers.0.query");
  CHECK(q0.at(0, 0, 0) == -0.50341796875f);
  CHECK(q0.at(0, 0, 1) == 1.126953125f);
  CHECK(q0.at(0, 0, 2) == -0.477783203125f);
  CHECK(q0.at(0, 0, 3) == -0.06573486328125f);
  double abs_sum = 0;
  for (float v : q0.data) abs_sum += std::fabs(v);
  CHECK(abs_sum == doctest::Approx(34532.509244561195).epsilon(1e-12));
  CHECK(store->read_f32("layers.5.key").at(5, 127, 63) == -0.1512451171875f);
  CHECK(store->read_f32("layers.0.value").at(2, 100, 17) == -0.0135345458984375f);
  const Tensor ao = store->read_f32("layers.5.attn_output");
  CHECK(ao.data[127 * 384 + 383] == -0.11199951171875f);
  CHECK(ao.data[0] == -0.38330078125f);
}

TEST_CASE("fixture: llama-bytes and reasoning-bytes recording files") {
  const auto store = TensorStore::open(data_dir() / "reference/llama-bytes-record-slice.safetensors");
  CHECK(store->list().size() == 11);  // with key_pre_rope
  CHECK(store->info("layers.0.key").shape == std::vector<int64_t>{2, 128, 64});
  CHECK(store->info("layers.0.query").shape == std::vector<int64_t>{6, 128, 64});
  CHECK(store->metadata().at("rope") == "key/query are post-RoPE; key_pre_rope is pre-RoPE");
  CHECK(store->read_f32("layers.0.key_pre_rope").at(1, 10, 5) == -1.1689453125f);
  CHECK(store->read_f32("layers.5.query").at(5, 127, 0) == -0.1590576171875f);
  CHECK(store->read_f32("layers.5.key").at(1, 100, 32) == 0.218017578125f);
  double abs_sum = 0;
  for (float v : store->read_f32("layers.5.key").data) abs_sum += std::fabs(v);
  CHECK(abs_sum == doctest::Approx(27182.314944386482).epsilon(1e-12));

  const auto reasoning = TensorStore::open(data_dir() / "reference/reasoning-bytes-record-slice.safetensors");
  CHECK(reasoning->info("layers.3.query").shape == std::vector<int64_t>{4, 128, 64});
  CHECK(reasoning->info("layers.3.key").shape == std::vector<int64_t>{2, 128, 64});
  CHECK(reasoning->metadata().at("end_think_token") == "258");
  CHECK(reasoning->metadata().at("end_think_position_of_full_recording") == "768");
  CHECK(reasoning->read_f32("layers.3.key").at(1, 127, 63) == 0.0462646484375f);
  CHECK(reasoning->read_f32("layers.0.key_pre_rope").at(0, 5, 3) == -0.067138671875f);
}

TEST_CASE("fixture: reference files (I32 token ids, F32 logits)") {
  for (const char* model : {"gpt2", "llama"}) {
    const std::string model_name = model;
    CAPTURE(model_name);
    const auto store = TensorStore::open(data_dir() / "reference" / (std::string(model) + "-bytes-reference.safetensors"));
    CHECK(store->info("input_ids").dtype == DType::I32);
    const std::vector<int64_t> ids = store->read_i64("input_ids");
    REQUIRE(ids.size() == 512);
    CHECK(std::vector<int64_t>(ids.begin(), ids.begin() + 8) == std::vector<int64_t>{256, 10, 82, 101, 118, 101, 108, 97});
    CHECK(std::vector<int64_t>(ids.end() - 3, ids.end()) == std::vector<int64_t>{101, 32, 105});
    int64_t sum = 0;
    for (int64_t v : ids) sum += v;
    CHECK(sum == 45694);
    CHECK(store->info("logits").shape == std::vector<int64_t>{512, 257});
    CHECK(store->info("nll").dtype == DType::F32);
    const std::string msg = error_of([&] { store->read_i64("logits"); });
    CHECK(has(msg, "'logits' has float dtype F32"));
  }
  const auto g = TensorStore::open(data_dir() / "reference/gpt2-bytes-reference.safetensors");
  const Tensor logits = g->read_f32("logits");
  CHECK(logits.data[0] == -13.727551460266113f);
  CHECK(logits.data[511 * 257 + 256] == -2.0478501319885254f);
  CHECK(logits.data[100 * 257 + 101] == -3.0734076499938965f);
  const Tensor nll = g->read_f32("nll");
  CHECK(nll.data[0] == 4.168124198913574f);
  CHECK(nll.data[511] == 0.04386499896645546f);
  // Rows of a tensor read alone (read_raw_rows): the whole tensor's rows, bytes as stored.
  std::vector<float> rows(3 * 257);
  g->read_raw_rows("logits", 100, 3, rows.data());
  CHECK(std::equal(rows.begin(), rows.end(), logits.data.begin() + 100 * 257));
  g->read_raw_rows("logits", 512, 0, rows.data());  // no rows: nothing read
  CHECK(has(error_of([&] { g->read_raw_rows("logits", 510, 3, rows.data()); }),
            "tensor 'logits': rows [510, 513) outside its 512 rows"));
  const auto l = TensorStore::open(data_dir() / "reference/llama-bytes-reference.safetensors");
  CHECK(l->read_f32("logits").data[0] == -11.990362167358398f);
  CHECK(l->read_f32("nll").data[511] == 8.380061626667157e-05f);
  // reasoning-bytes: one think/answer trace, </think> (258) at position 768; its nll
  // stops at the last token (976 targets).
  const auto r = TensorStore::open(data_dir() / "reference/reasoning-bytes-reference.safetensors");
  const std::vector<int64_t> ids = r->read_i64("input_ids");
  REQUIRE(ids.size() == 977);
  CHECK(std::vector<int64_t>(ids.begin(), ids.begin() + 6) == std::vector<int64_t>{256, 81, 58, 32, 83, 116});
  CHECK(ids[768] == 258);
  CHECK(std::accumulate(ids.begin(), ids.end(), int64_t{0}) == 61267);
  CHECK(r->info("logits").shape == std::vector<int64_t>{977, 259});
  CHECK(r->info("nll").shape == std::vector<int64_t>{976});
}

TEST_CASE("fixture: Hugging Face sharded checkpoints") {
  SUBCASE("gpt2-bytes by directory (F16)") {
    const auto store = TensorStore::open(data_dir() / "models/gpt2-bytes");
    CHECK(store->list().size() == 76);
    CHECK(store->metadata().at("total_parameters") == "11139456");
    const TensorInfo& wte = store->info("transformer.wte.weight");
    CHECK(wte.dtype == DType::F16);
    CHECK(wte.shape == std::vector<int64_t>{257, 384});
    CHECK(fs::path(wte.file).filename() == "model-00001-of-00002.safetensors");
    const Tensor w = store->read_f32("transformer.wte.weight");
    CHECK(w.data.front() == -0.061981201171875f);
    CHECK(w.data.back() == 0.033721923828125f);
    double sum = 0;
    for (float v : w.data) sum += v;
    CHECK(sum == doctest::Approx(-131.91063874959946).epsilon(1e-10));
    const TensorInfo& proj = store->info("transformer.h.5.mlp.c_proj.weight");
    CHECK(proj.shape == std::vector<int64_t>{1536, 384});  // Conv1D: [in, out]
    CHECK(fs::path(proj.file).filename() == "model-00002-of-00002.safetensors");
    CHECK(store->read_f32("transformer.ln_f.bias").data.front() == 0.1016845703125f);
    CHECK_FALSE(store->contains("lm_head.weight"));  // tied to wte
  }
  SUBCASE("llama-bytes by index file (BF16)") {
    const auto store = TensorStore::open(data_dir() / "models/llama-bytes/model.safetensors.index.json");
    CHECK(store->list().size() == 57);
    const TensorInfo& head = store->info("lm_head.weight");
    CHECK(head.dtype == DType::BF16);
    CHECK(head.shape == std::vector<int64_t>{257, 384});
    CHECK(fs::path(head.file).filename() == "model-00002-of-00002.safetensors");
    const Tensor h = store->read_f32("lm_head.weight");
    CHECK(h.data.front() == 0.002685546875f);
    CHECK(h.data.back() == 0.06298828125f);
    const Tensor emb = store->read_f32("model.embed_tokens.weight");
    CHECK(emb.data.front() == -0.0264892578125f);
    CHECK(emb.data.back() == 0.07421875f);
    CHECK(store->info("model.layers.5.self_attn.k_proj.weight").shape == std::vector<int64_t>{128, 384});
    double sum = 0;
    for (float v : store->read_f32("model.norm.weight").data) sum += v;
    CHECK(sum == 433.8046875);  // exact: BF16 values summed in double
  }
}
