// ggml block formats: codes and dequantized values bit-exact with ggml's reference
// quantizers. The expected bytes come from a plain re-statement of ggml's reference
// semantics below (quantize_row_*_ref / dequantize_row_* in ggml-quants.c: same
// operations, same order, fp16 via the CPU's F16C conversion when available), written
// independently of sim/formats/ggml_blocks.h, plus hand-checked blocks.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "sim/core/error.h"
#include "sim/formats/ggml_blocks.h"
#include "sim/formats/ggml_format.h"
#include "sim/formats/registry.h"
#include "test_util.h"

using namespace kvb;

namespace {

using Bytes = std::vector<uint8_t>;

// ------------------------------------------------------------------ reference
uint16_t ref_to_fp16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
  int e = std::ilogb(a);
  double m = std::nearbyint(std::ldexp(a, 10 - e));
  if (m == 2048) { m = 1024; ++e; }
  return sign | static_cast<uint16_t>(((e + 15) << 10) | (static_cast<int>(m) - 1024));
#endif
}

float ref_from_fp16(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return static_cast<float>((h & 0x8000) ? -v : v);
#endif
}

// C's float -> int8_t on x86-64: truncation; NaN / out of int32 range give 0x80000000,
// whose low byte is 0.
int to_int8(float v) {
  if (std::isnan(v) || std::fabs(v) >= 2147483648.0f) return 0;
  return static_cast<int8_t>(static_cast<int32_t>(v) & 0xff);
}
int to_uint8(float v) { return static_cast<uint8_t>(to_int8(v)); }

void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v & 0xff));
  b.push_back(static_cast<uint8_t>(v >> 8));
}

float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

Bytes ref_q4_0(const float* x) {
  const float d = signed_absmax(x) / -8;
  const float id = d ? 1.0f / d : 0.0f;
  Bytes b;
  put16(b, ref_to_fp16(d));
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, to_int8(x[j] * id + 8.5f));
    const int q1 = std::min(15, to_int8(x[16 + j] * id + 8.5f));
    b.push_back(static_cast<uint8_t>(q0 | (q1 << 4)));
  }
  return b;
}

Bytes ref_q4_1(const float* x) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / 15;
  const float id = d ? 1.0f / d : 0.0f;
  Bytes b;
  put16(b, ref_to_fp16(d));
  put16(b, ref_to_fp16(min));
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, to_int8((x[j] - min) * id + 0.5f));
    const int q1 = std::min(15, to_int8((x[16 + j] - min) * id + 0.5f));
    b.push_back(static_cast<uint8_t>(q0 | (q1 << 4)));
  }
  return b;
}

Bytes ref_q5_0(const float* x) {
  const float d = signed_absmax(x) / -16;
  const float id = d ? 1.0f / d : 0.0f;
  Bytes b;
  put16(b, ref_to_fp16(d));
  uint32_t qh = 0;
  Bytes qs;
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(31, to_int8(x[j] * id + 16.5f));
    const int q1 = std::min(31, to_int8(x[16 + j] * id + 16.5f));
    qs.push_back(static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4)));
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(qh >> (8 * i)));
  b.insert(b.end(), qs.begin(), qs.end());
  return b;
}

Bytes ref_q5_1(const float* x) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int j = 0; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / 31;
  const float id = d ? 1.0f / d : 0.0f;
  Bytes b;
  put16(b, ref_to_fp16(d));
  put16(b, ref_to_fp16(min));
  uint32_t qh = 0;
  Bytes qs;
  for (int j = 0; j < 16; ++j) {
    const int q0 = to_uint8((x[j] - min) * id + 0.5f);
    const int q1 = to_uint8((x[16 + j] - min) * id + 0.5f);
    qs.push_back(static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4)));
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(qh >> (8 * i)));
  b.insert(b.end(), qs.begin(), qs.end());
  return b;
}

Bytes ref_q8_0(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  Bytes b;
  put16(b, ref_to_fp16(d));
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(to_int8(std::round(x[j] * id))));
  return b;
}

const int kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int ref_best_index(float x) {
  if (x <= kIq4Values[0]) return 0;
  if (x >= kIq4Values[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < kIq4Values[mav]) mu = mav;
    else ml = mav;
  }
  return x - kIq4Values[mu - 1] < kIq4Values[mu] - x ? mu - 1 : mu;
}

Bytes ref_iq4_nl(const float* x, int ntry) {
  float weight[32];
  int L[32];
  for (int j = 0; j < 32; ++j) weight[j] = x[j] * x[j];
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  float scale;
  if (amax < 1e-15f) {
    scale = 0;
    for (int j = 0; j < 32; ++j) L[j] = 0;
  } else {
    float d = ntry > 0 ? -max / kIq4Values[0] : max / kIq4Values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = ref_best_index(id * x[j]);
      L[j] = l;
      const float q = kIq4Values[l];
      sumqx += weight[j] * q * x[j];
      sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; ++itry) {
      id = (itry + kIq4Values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = kIq4Values[ref_best_index(id * x[j])];
        sumqx += weight[j] * q * x[j];
        sumq2 += weight[j] * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scale = d;
  }
  if (ntry > 0) {
    const float id = scale ? 1 / scale : 0;
    for (int j = 0; j < 32; ++j) L[j] = ref_best_index(id * x[j]);
  }
  Bytes b;
  put16(b, ref_to_fp16(scale));
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(L[j] | (L[j + 16] << 4)));
  return b;
}

// Dequantization, reading the bytes.
std::vector<float> ref_dequant(const std::string& type, const Bytes& b) {
  std::vector<float> y(32);
  const float d = ref_from_fp16(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  if (type == "q4_0" || type == "iq4_nl" || type == "iq4_nl-ntry7") {
    for (int j = 0; j < 16; ++j) {
      const int lo = b[2 + j] & 15, hi = b[2 + j] >> 4;
      if (type == "q4_0") {
        y[j] = (lo - 8) * d;
        y[j + 16] = (hi - 8) * d;
      } else {
        y[j] = d * kIq4Values[lo];
        y[j + 16] = d * kIq4Values[hi];
      }
    }
  } else if (type == "q4_1") {
    const float m = ref_from_fp16(static_cast<uint16_t>(b[2] | (b[3] << 8)));
    for (int j = 0; j < 16; ++j) {
      y[j] = (b[4 + j] & 15) * d + m;
      y[j + 16] = (b[4 + j] >> 4) * d + m;
    }
  } else if (type == "q5_0" || type == "q5_1") {
    const bool has_m = type == "q5_1";
    const float m = has_m ? ref_from_fp16(static_cast<uint16_t>(b[2] | (b[3] << 8))) : 0.0f;
    const size_t o = has_m ? 4 : 2;
    uint32_t qh = 0;
    for (int i = 0; i < 4; ++i) qh |= static_cast<uint32_t>(b[o + i]) << (8 * i);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[o + 4 + j] & 15) | (((qh >> j) & 1) << 4);
      const int q1 = (b[o + 4 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      if (has_m) {
        y[j] = q0 * d + m;
        y[j + 16] = q1 * d + m;
      } else {
        y[j] = (q0 - 16) * d;
        y[j + 16] = (q1 - 16) * d;
      }
    }
  } else if (type == "q8_0") {
    for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(b[2 + j]) * d;
  }
  return y;
}

Bytes ref_quant(const std::string& type, const float* x) {
  if (type == "q4_0") return ref_q4_0(x);
  if (type == "q4_1") return ref_q4_1(x);
  if (type == "q5_0") return ref_q5_0(x);
  if (type == "q5_1") return ref_q5_1(x);
  if (type == "q8_0") return ref_q8_0(x);
  if (type == "iq4_nl") return ref_iq4_nl(x, -1);
  if (type == "iq4_nl-ntry7") return ref_iq4_nl(x, 7);
  FAIL("unknown type " << type);
  return {};
}

const char* kTypes[] = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "iq4_nl-ntry7"};

bool same_bits(float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// Blocks that probe ggml's edge semantics.
std::vector<std::vector<float>> adversarial_blocks() {
  std::vector<std::vector<float>> blocks;
  auto add = [&](std::vector<float> b) { blocks.push_back(std::move(b)); };
  add(std::vector<float>(32, 0.0f));                      // zeros
  add(std::vector<float>(32, -0.0f));                     // negative zeros
  add(std::vector<float>(32, 1.0f));                      // all equal
  add(std::vector<float>(32, -3.25f));
  add(std::vector<float>(32, 65504.0f));                  // fp16 max
  std::vector<float> b(32);
  for (int j = 0; j < 32; ++j) b[j] = static_cast<float>(j - 16);  // exact .5 boundaries for q4_0/q5_0
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = static_cast<float>(j) * 0.5f - 8.0f;
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = (j % 2 ? 1.0f : -1.0f) * (0.5f + static_cast<float>(j % 5));  // +/- ties in |max|
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = j == 7 ? 8.0f : (j == 20 ? -8.0f : 0.25f * static_cast<float>(j % 7));
  add(b);  // +max first, then -max with equal magnitude
  for (int j = 0; j < 32; ++j) b[j] = j == 3 ? -8.0f : (j == 9 ? 8.0f : 0.125f * static_cast<float>(j % 9));
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = static_cast<float>(j % 16) - 1.0f + (j >= 16 ? 0.5f : 0.0f);  // q4_1 ties
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = 127.0f * static_cast<float>(j % 11 - 5) / 5.0f + 0.5f;
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = j == 0 ? 127.0f : static_cast<float>(j - 16) + 0.5f;  // q8_0 ties (d = 1)
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = 3e-6f * static_cast<float>(j - 13);  // fp16-subnormal scales
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = 1e-39f * static_cast<float>(j - 13);  // fp32 subnormals: 1/d overflows
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = 1e-30f * static_cast<float>(j - 13);
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = (j == 0 ? 1e-16f : 0.0f);  // below iq4_nl's GROUP_MAX_EPS
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = static_cast<float>(kIq4Values[j % 16]);  // on iq4_nl's grid
  add(b);
  for (int j = 0; j < 32; ++j) b[j] = 0.5f * static_cast<float>(kIq4Values[j % 16] + kIq4Values[(j + 1) % 16]);
  add(b);  // iq4_nl midpoints (ties go to the upper index)
  for (int j = 0; j < 32; ++j) b[j] = (j < 16 ? 1e5f : -1e5f) * static_cast<float>(j % 3 + 1);  // fp16 overflow of d
  add(b);
  return blocks;
}

void check_blocks(const std::string& type, const std::vector<float>& x, int64_t rows) {
  INFO("format " << type << ", " << rows << " rows");
  FormatPtr f = make_format(type);
  const int64_t d = static_cast<int64_t>(x.size()) / rows;
  ConstMatView in{x.data(), rows, d, d};
  BitWriter w;
  f->encode(in, SpanInfo{}, w);
  REQUIRE(w.bits() == f->storage_bits(rows, d));
  std::vector<float> out(x.size());
  f->roundtrip(in, MatView{out.data(), rows, d, d}, SpanInfo{});
  const size_t bb = static_cast<size_t>(ggml_block_bytes(std::dynamic_pointer_cast<const GgmlFormat>(f)->type()));
  for (size_t blk = 0; blk < x.size() / 32; ++blk) {
    const Bytes expect = ref_quant(type, x.data() + blk * 32);
    REQUIRE(expect.size() == bb);
    const Bytes got(w.bytes().begin() + static_cast<std::ptrdiff_t>(blk * bb),
                    w.bytes().begin() + static_cast<std::ptrdiff_t>((blk + 1) * bb));
    CHECK_MESSAGE(got == expect, "block " << blk << " first value " << x[blk * 32]);
    const std::vector<float> y = ref_dequant(type, expect);
    for (int j = 0; j < 32; ++j)
      CHECK_MESSAGE(same_bits(out[blk * 32 + j], y[j]), "block " << blk << " element " << j << ": " << out[blk * 32 + j]
                                                                 << " vs " << y[j]);
  }
}

}  // namespace

TEST_CASE("ggml formats match the reference semantics on random blocks") {
  for (const char* type : kTypes) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const float sigma = seed == 1 ? 1.0f : (seed == 2 ? 0.01f : 300.0f);
      std::vector<float> x = kvb::test::random_normal(64 * 128, seed, sigma);
      if (seed == 3)  // heavy tails: a few large outliers per row
        for (size_t i = 0; i < x.size(); i += 37) x[i] *= 40.0f;
      check_blocks(type, x, 64);
    }
  }
}

TEST_CASE("ggml formats match the reference semantics on adversarial blocks") {
  std::vector<float> x;
  for (const auto& b : adversarial_blocks()) x.insert(x.end(), b.begin(), b.end());
  for (const char* type : kTypes) check_blocks(type, x, static_cast<int64_t>(x.size() / 32));
}

TEST_CASE("ggml blocks: hand-checked bytes") {
  auto encode = [](const std::string& type, const std::vector<float>& x) {
    BitWriter w;
    make_format(type)->encode(ConstMatView{x.data(), 1, 32, 32}, SpanInfo{}, w);
    return w.bytes();
  };
  std::vector<float> x(32);
  // q4_0 on -16..15: max is the first -16, d = -16 / -8 = 2 (fp16 0x4000), code = min(15, (j+1)/2).
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  CHECK(encode("q4_0", x) == Bytes{0x00, 0x40, 0x80, 0x91, 0x91, 0xa2, 0xa2, 0xb3, 0xb3, 0xc4, 0xc4, 0xd5, 0xd5, 0xe6,
                                   0xe6, 0xf7, 0xf7, 0xf8});
  // q5_0 on -16..15: d = 1, code j: low nibbles j|j<<4, fifth bits set for elements 16..31.
  Bytes q5 = {0x00, 0x3c, 0x00, 0x00, 0xff, 0xff};
  for (int j = 0; j < 16; ++j) q5.push_back(static_cast<uint8_t>(j | (j << 4)));
  CHECK(encode("q5_0", x) == q5);
  // q4_1 on (j mod 16) - 1: min -1 (0xbc00), d = 1, code j mod 16.
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16) - 1.0f;
  Bytes q41 = {0x00, 0x3c, 0x00, 0xbc};
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<uint8_t>(j | (j << 4)));
  CHECK(encode("q4_1", x) == q41);
  // q5_1 on j - 1: min -1, d = 31/31 = 1, code j.
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 1.0f;
  Bytes q51 = {0x00, 0x3c, 0x00, 0xbc, 0x00, 0x00, 0xff, 0xff};
  for (int j = 0; j < 16; ++j) q51.push_back(static_cast<uint8_t>(j | (j << 4)));
  CHECK(encode("q5_1", x) == q51);
  // q8_0 with absmax 127 (d = 1): roundf rounds 2.5 to 3 and -2.5 to -3 (not to even).
  x.assign(32, 0.0f);
  const float v[10] = {127.0f, -127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -0.5f, 1.49f, -1.5f, -3.5f};
  for (int j = 0; j < 10; ++j) x[j] = v[j];
  Bytes q8 = {0x00, 0x3c, 127, static_cast<uint8_t>(-127), 3, static_cast<uint8_t>(-3), 4, 1, static_cast<uint8_t>(-1), 1,
              static_cast<uint8_t>(-2), static_cast<uint8_t>(-4)};
  q8.resize(34, 0);
  CHECK(encode("q8_0", x) == q8);
  // iq4_nl on its own grid: d = -127 / -127 = 1, the least-squares refit keeps 1, codes j mod 16.
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(kIq4Values[j % 16]);
  Bytes iq = {0x00, 0x3c};
  for (int j = 0; j < 16; ++j) iq.push_back(static_cast<uint8_t>(j | (j << 4)));
  CHECK(encode("iq4_nl", x) == iq);
  // Dequantized q4_0 of -16..15 reproduces the even values exactly.
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  std::vector<float> y(32);
  make_format("q4_0")->roundtrip(ConstMatView{x.data(), 1, 32, 32}, MatView{y.data(), 1, 32, 32}, SpanInfo{});
  CHECK(y[0] == -16.0f);
  CHECK(y[2] == -14.0f);
  CHECK(y[31] == 14.0f);
}

TEST_CASE("iq4_nl: counting grid midpoints equals ggml's best_index_int8") {
  // The format counts midpoints <= x; ggml binary-searches and compares distances.
  // Verified offline over all 2^32 bit patterns; here: every grid value and midpoint
  // with 2000 floats either side, and a million random bit patterns.
  std::vector<float> probes;
  for (int k = 0; k < 16; ++k) {
    const float anchors[2] = {static_cast<float>(kIq4Values[k]),
                              k < 15 ? 0.5f * static_cast<float>(kIq4Values[k] + kIq4Values[k + 1]) : 0.0f};
    for (float a : anchors) {
      float lo = a, hi = a;
      for (int i = 0; i < 2000; ++i) {
        probes.push_back(lo = std::nextafter(lo, -INFINITY));
        probes.push_back(hi = std::nextafter(hi, INFINITY));
      }
      probes.push_back(a);
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isnan(f)) probes.push_back(f);
  }
  size_t bad = 0;
  for (float x : probes) bad += ggml_iq4nl_best_index(x) != ref_best_index(x) ? 1 : 0;
  CHECK(bad == 0);
}

TEST_CASE("ggml block sizes give the bits per element of methods.md §1") {
  CHECK(make_format("q4_0")->bpe(16, 128) == 4.5);
  CHECK(make_format("q4_1")->bpe(16, 128) == 5.0);
  CHECK(make_format("q5_0")->bpe(16, 128) == 5.5);
  CHECK(make_format("q5_1")->bpe(16, 128) == 6.0);
  CHECK(make_format("q8_0")->bpe(16, 128) == 8.5);
  CHECK(make_format("iq4_nl")->bpe(16, 128) == 4.5);
  CHECK(make_format("q4_0")->check_shape(16, 80) != "");
  CHECK_THROWS_WITH_AS(make_format("q4_0-ntry3"), doctest::Contains("no options"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("iq4_nl-ntry"), doctest::Contains("iq4_nl-ntry<N>"), ConfigError);
}

TEST_CASE("a block whose fp16 scale overflows decodes to x86's default NaN (what the CUDA twin stores too)") {
  // max|x| = 1e30: d = -1.25e29 is -inf in fp16; the zeros get code 8, and (8 - 8)·(-inf)
  // is NaN: on x86-64 the default NaN 0xffc00000, which the device reproduces (x86_nan).
  float x[kGgmlBlock] = {};
  x[3] = 1e30f;
  float y[kGgmlBlock];
  GgmlBlockQ4_0 b;
  ggml_quantize_q4_0(x, b);
  CHECK(b.d == 0xfc00);
  ggml_dequantize_q4_0(b, y);
  uint32_t bits;
  std::memcpy(&bits, &y[0], sizeof bits);
  CHECK(bits == 0xffc00000u);
  // iq4_nl: x² overflows, the weighted sums give ∞/∞, and the stored scale is that NaN in fp16.
  GgmlBlockIQ4NL bi;
  for (int j = 0; j < kGgmlBlock; ++j) x[j] = (j % 2 ? -1e30f : 2e29f);
  ggml_quantize_iq4_nl(x, bi, 7);
  CHECK(bi.d == 0xfe00);
}
