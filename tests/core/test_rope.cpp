// RoPE (sim/core/rope.h): the Hugging Face rotate_half convention, its inverse, the
// relative-position property, and parity with a real Llama recorded by transformers.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/core/rope.h"
#include "test_util.h"

namespace {

using kvb::test::random_normal;

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Reads one F16 tensor of a safetensors file as fp32 (enough for this test; the
// project's TensorStore is the general reader).
std::vector<float> read_f16_tensor(const std::filesystem::path& file, const std::string& name,
                                   std::vector<int64_t>& shape) {
  std::ifstream in(file, std::ios::binary);
  REQUIRE(in);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  REQUIRE(h.contains(name));
  REQUIRE(h[name]["dtype"] == "F16");
  shape = h[name]["shape"].get<std::vector<int64_t>>();
  const auto offsets = h[name]["data_offsets"].get<std::vector<uint64_t>>();
  std::vector<uint16_t> raw((offsets[1] - offsets[0]) / 2);
  in.seekg(static_cast<std::streamoff>(8 + header_len + offsets[0]));
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 2));
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = kvb::f16_bits_to_f32(raw[i]);
  return out;
}

}  // namespace

TEST_CASE("rope: the rotate_half formula on a hand-checked vector") {
  // d = 4: pairs (0, 2) and (1, 3); angles pos·theta^0 and pos·theta^(-1/2).
  const double theta = 100.0;
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const int64_t pos = 3;
  kvb::apply_rope(x.data(), 1, 4, &pos, theta);
  const double a0 = 3.0, a1 = 3.0 / 10.0;
  CHECK(x[0] == doctest::Approx(1 * std::cos(a0) - 3 * std::sin(a0)).epsilon(1e-6));
  CHECK(x[2] == doctest::Approx(3 * std::cos(a0) + 1 * std::sin(a0)).epsilon(1e-6));
  CHECK(x[1] == doctest::Approx(2 * std::cos(a1) - 4 * std::sin(a1)).epsilon(1e-6));
  CHECK(x[3] == doctest::Approx(4 * std::cos(a1) + 2 * std::sin(a1)).epsilon(1e-6));
  CHECK(kvb::rope_inv_freq(1, 4, theta) == doctest::Approx(0.1));
}

TEST_CASE("rope: invert undoes apply; tables give the same floats; position 0 is identity") {
  const int64_t T = 300, d = 64;
  const std::vector<float> x = random_normal(static_cast<size_t>(T * d), 5);
  std::vector<float> y = x;
  kvb::apply_rope(y.data(), T, d, nullptr, 10000.0);
  CHECK(max_abs_diff(x.data(), y.data(), static_cast<size_t>(d)) == 0.0);  // row 0: angle 0
  CHECK(max_abs_diff(x.data(), y.data(), x.size()) > 0.1);
  std::vector<float> z = x;
  const kvb::RopeTable table = kvb::make_rope_table(T, d, nullptr, 10000.0);
  kvb::apply_rope(z.data(), table);
  CHECK(std::memcmp(y.data(), z.data(), y.size() * sizeof(float)) == 0);
  kvb::invert_rope(y.data(), T, d, nullptr, 10000.0);
  CHECK(max_abs_diff(x.data(), y.data(), x.size()) < 1e-5);

  // Tensor form with explicit positions, e.g. a shifted window.
  kvb::Tensor heads({2, T, d});
  std::copy(x.begin(), x.end(), heads.slice(0));
  std::copy(x.begin(), x.end(), heads.slice(1));
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = 1000 + t;
  kvb::apply_rope(heads, positions, 500000.0);
  kvb::invert_rope(heads, positions, 500000.0);
  CHECK(max_abs_diff(x.data(), heads.slice(1), x.size()) < 1e-4);
  CHECK_THROWS_AS(kvb::apply_rope(heads, std::vector<int64_t>(3, 0), 10000.0), kvb::Error);
  kvb::Tensor odd({1, 2, 3});
  CHECK_THROWS_AS(kvb::apply_rope(odd, {}, 10000.0), kvb::Error);
}

TEST_CASE("rope: rotated dot products depend only on the distance t - j") {
  const int64_t d = 32;
  const std::vector<float> q = random_normal(d, 1), k = random_normal(d, 2);
  auto rotated_dot = [&](int64_t t, int64_t j) {
    std::vector<float> qr = q, kr = k;
    kvb::apply_rope(qr.data(), 1, d, &t, 10000.0);
    kvb::apply_rope(kr.data(), 1, d, &j, 10000.0);
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += static_cast<double>(qr[c]) * kr[c];
    return s;
  };
  CHECK(rotated_dot(10, 3) == doctest::Approx(rotated_dot(107, 100)).epsilon(1e-4));
  CHECK(rotated_dot(50, 50) == doctest::Approx(rotated_dot(0, 0)).epsilon(1e-5));
}

TEST_CASE("rope: matches Hugging Face's post-RoPE keys of the recorded llama-bytes") {
  // data/reference/llama-bytes-record-slice.safetensors: key_pre_rope and key of a
  // LlamaForCausalLM (theta 10000, head_dim 64) recorded by transformers in fp32, stored
  // as fp16 (its first 128 tokens, layers 0 and 5).
  const auto file = kvb::test::data_dir() / "reference" / "llama-bytes-record-slice.safetensors";
  for (const int layer : {0, 5}) {
    std::vector<int64_t> shape, shape2;
    std::vector<float> pre = read_f16_tensor(file, "layers." + std::to_string(layer) + ".key_pre_rope", shape);
    const std::vector<float> post = read_f16_tensor(file, "layers." + std::to_string(layer) + ".key", shape2);
    REQUIRE(shape == shape2);
    REQUIRE(shape.size() == 3);
    const int64_t H = shape[0], T = shape[1], d = shape[2];
    double worst = 0, scale = 0;
    for (int64_t h = 0; h < H; ++h) {
      float* x = pre.data() + h * T * d;
      kvb::apply_rope(x, T, d, nullptr, 10000.0);
      for (int64_t i = 0; i < T * d; ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(x[i]) - post[static_cast<size_t>(h * T * d + i)]));
        scale = std::max(scale, std::abs(static_cast<double>(post[static_cast<size_t>(h * T * d + i)])));
      }
    }
    // Both tensors went through fp16 storage: allow a few fp16 ulps of the largest value.
    INFO("layer " << layer << ": worst |rope(pre) - post| = " << worst << " (max |post| = " << scale << ")");
    CHECK(worst < 4e-3 * scale);
  }
}
