// Integer quantizers (sim/formats/int_format.*, int_block.h) and the format table:
// error bounds, exact code ranges, exact bits per element, name round trips.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/int_block.h"
#include "sim/formats/int_format.h"
#include "sim/formats/registry.h"
#include "test_util.h"

using namespace kvb;

namespace {

std::vector<float> roundtrip(const Format& f, const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> out(x.size());
  f.roundtrip(ConstMatView{x.data(), rows, cols, cols}, MatView{out.data(), rows, cols, cols}, SpanInfo{});
  return out;
}

}  // namespace

TEST_CASE("fp16 and bf16 conversion round to nearest even, with subnormals and overflow") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65519.0f) == 0x7bff);      // below the halfway point
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);      // halfway to 2^16 rounds to even = inf
  CHECK(f32_to_f16_bits(5.9604645e-08f) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(2.9802322e-08f) == 0x0000);  // exactly half of it: ties to even (0)
  CHECK(f32_to_f16_bits(8.940697e-08f) == 0x0002);   // 1.5 ulp: ties to even (2)
  CHECK(f32_to_f16_bits(6.1035156e-05f) == 0x0400);  // smallest normal
  CHECK(f32_to_f16_bits(1.0f + 1.0f / 2048.0f) == 0x3c00);  // tie between 1 and 1+2^-10: even
  CHECK(f32_to_f16_bits(1.0f + 3.0f / 2048.0f) == 0x3c02);  // tie: to even mantissa 2
  CHECK(std::isnan(f16_bits_to_f32(f32_to_f16_bits(NAN))));
  // Every half value survives a round trip through fp32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16_bits(f) == h);
  }
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(bits_float(0x3f808000u)) == 0x3f80);  // tie: to even
  CHECK(f32_to_bf16_bits(bits_float(0x3f818000u)) == 0x3f82);  // tie: to even
  CHECK(f32_to_bf16_bits(bits_float(0x3f808001u)) == 0x3f81);  // above the tie
}

TEST_CASE("format names parse to canonical names and back") {
  for (const FormatFamily& fam : format_families()) {
    for (const FormatExample& example : fam.examples) {
      const std::string& ex = example.name;
      FormatPtr f = make_format(ex);
      CHECK_MESSAGE(f->name() == ex, "example " << ex << " is not canonical");
      CHECK(make_format(f->name())->name() == f->name());
    }
  }
  CHECK(make_format("int4-asym-g32-sfp16-zfp16")->name() == "int4-asym-g32");
  CHECK(make_format("fp16")->name() == "keep-fp16");
}

TEST_CASE("malformed format names are clear errors") {
  CHECK_THROWS_WITH_AS(make_format("int9-asym-g32"), doctest::Contains("bits must be 1..8"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-asim-g32"), doctest::Contains("mode must be"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-asym-x32"), doctest::Contains("grouping"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-sym-g32-zfp32"), doctest::Contains("store no zero"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-asym-g0"), doctest::Contains(">= 1"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-asym"), doctest::Contains("expected int<b>"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("keep-fp8"), doctest::Contains("keep-fp16"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("int4-asym-g32-q"), doctest::Contains("unknown option"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("kep-fp16"), doctest::Contains("did you mean 'keep-fp16'"), ConfigError);
}

TEST_CASE("exact bits per element include every scale and zero (methods.md 1)") {
  // asymmetric int-b, fp16 scale + fp16 min per group of G: b + 32/G
  CHECK(make_format("int2-asym-g32")->bpe(512, 64) == 3.0);   // KIVI-2 G=32
  CHECK(make_format("int4-asym-g64")->bpe(512, 128) == 4.5);  // quanto int4
  CHECK(make_format("int2-asym-g64")->bpe(512, 128) == 2.5);  // quanto int2
  // symmetric int-b, fp16 scale per group: b + 16/G
  CHECK(make_format("int4-sym-g32")->bpe(100, 64) == 4.5);
  CHECK(make_format("int8-sym-tok")->bpe(100, 64) == 8.25);
  CHECK(make_format("int3-asym-tok-sfp32-zfp32")->bpe(7, 128) == 3.5);
  CHECK(make_format("int4-asym-g16-sbf16-zfp32")->bpe(9, 64) == 4.0 + 48.0 / 16.0);
  // per channel, groups of 32 tokens: 96 tokens = 3 groups per channel
  CHECK(make_format("int2-asym-ch32")->storage_bits(96, 64) == 96u * 64u * 2u + 3u * 64u * 32u);
  // a partial last group pays its own metadata: 100 tokens = 4 groups
  CHECK(make_format("int2-asym-ch32")->storage_bits(100, 64) == 100u * 64u * 2u + 4u * 64u * 32u);
  CHECK(make_format("int2-asym-ch")->storage_bits(100, 64) == 100u * 64u * 2u + 64u * 32u);
  CHECK(make_format("keep-fp16")->bpe(3, 64) == 16.0);
  CHECK(make_format("keep-fp32")->bpe(3, 64) == 32.0);
  CHECK(make_format("int4-asym-g48")->check_shape(10, 64).find("does not divide") != std::string::npos);
}

TEST_CASE("asymmetric codes cover exactly 0..2^b-1 and errors stay within half a step") {
  const int64_t rows = 64, cols = 64;
  const std::vector<float> x = test::random_normal(static_cast<size_t>(rows * cols), 7);
  for (int bits = 1; bits <= 8; ++bits) {
    IntFormatSpec s;
    s.bits = bits;
    s.symmetric = false;
    s.group = 16;
    s.scale_dtype = s.zero_dtype = StoreDtype::F32;
    const float levels = static_cast<float>((1 << bits) - 1);
    std::set<int> codes;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const float* g = x.data() + r * cols + c0;
        const float lo = *std::min_element(g, g + 16), hi = *std::max_element(g, g + 16);
        const IntGroupParams p = int_asym_params(lo, hi, bits, s.scale_dtype, s.zero_dtype);
        CHECK(p.scale == doctest::Approx((hi - lo) / levels).epsilon(1e-6));
        for (int i = 0; i < 16; ++i) {
          const int q = int_asym_encode(g[i], p, bits);
          REQUIRE(q >= 0);
          REQUIRE(q <= (1 << bits) - 1);
          codes.insert(q);
          const float xhat = int_decode(q, p);
          // |x - x̂| <= s/2 (plus float rounding of the affine map)
          REQUIRE(std::fabs(g[i] - xhat) <= p.scale * 0.5f * (1 + 1e-5f) + 1e-6f * std::fabs(g[i]));
        }
        // min and max of the group are reproduced at the ends of the code range
        CHECK(int_asym_encode(lo, p, bits) == 0);
        CHECK(int_asym_encode(hi, p, bits) == (1 << bits) - 1);
      }
    CHECK(static_cast<int>(codes.size()) == (1 << bits));  // every code is reachable
  }
}

TEST_CASE("symmetric codes lie in +-(2^(b-1)-1) with error within half a step; b=1 is the sign quantizer") {
  const std::vector<float> x = test::random_normal(4096, 11, 2.0f);
  for (int bits = 2; bits <= 8; ++bits) {
    const int qmax = (1 << (bits - 1)) - 1;
    for (size_t g0 = 0; g0 < x.size(); g0 += 32) {
      float absmax = 0;
      for (size_t i = g0; i < g0 + 32; ++i) absmax = std::max(absmax, std::fabs(x[i]));
      const IntGroupParams p = int_sym_params(absmax, bits, StoreDtype::F32);
      for (size_t i = g0; i < g0 + 32; ++i) {
        const int q = int_sym_encode(x[i], p, bits);
        REQUIRE(q >= -qmax);
        REQUIRE(q <= qmax);
        REQUIRE(std::fabs(x[i] - int_decode(q, p)) <= p.scale * 0.5f * (1 + 1e-5f) + 1e-6f);
      }
    }
  }
  // b = 1: codes ±1, reconstruction ±mean|x| of the group.
  std::vector<float> g = {0.5f, -1.5f, 2.0f, -0.0f};
  FormatPtr f = make_format("int1-sym-g4-sfp32");
  const std::vector<float> y = roundtrip(*f, g, 1, 4);
  const float m = (0.5f + 1.5f + 2.0f + 0.0f) / 4.0f;
  CHECK(y == std::vector<float>{m, -m, m, m});
}

TEST_CASE("constant groups, zeros and fp16 metadata are handled exactly") {
  std::vector<float> same(64, 3.25f);
  for (const char* name : {"int4-asym-g32", "int2-asym-tok", "int3-asym-ch16", "int1-asym-g32"}) {
    const std::vector<float> y = roundtrip(*make_format(name), same, 2, 32);
    for (float v : y) CHECK(v == 3.25f);  // scale 0, min 3.25 (exact in fp16)
  }
  // Symmetric: the fp16 scale 3.25/7 is rounded, so only half a step is promised.
  const float s7 = round_to_f16(3.25f / 7.0f);
  for (float v : roundtrip(*make_format("int4-sym-g32"), same, 2, 32)) CHECK(v == 7.0f * s7);
  std::vector<float> zeros(64, 0.0f);
  for (float v : roundtrip(*make_format("int4-sym-g32"), zeros, 2, 32)) CHECK(v == 0.0f);
  // With fp16 metadata the stored scale and min are what decoding uses.
  const std::vector<float> x = test::random_normal(32, 3);
  const std::vector<float> y = roundtrip(*make_format("int4-asym-g32"), x, 1, 32);
  const float lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
  const float s16 = round_to_f16((hi - lo) / 15.0f), z16 = round_to_f16(lo);
  for (size_t i = 0; i < x.size(); ++i) {
    const float q = std::rint((x[i] - z16) / s16);
    CHECK(y[i] == std::max(0.0f, std::min(15.0f, q)) * s16 + z16);
  }
}

TEST_CASE("per-channel grouping quantizes each channel along tokens") {
  // Two channels with very different ranges: per-channel groups keep both accurate.
  const int64_t T = 64, d = 2;
  std::vector<float> x(static_cast<size_t>(T * d));
  for (int64_t t = 0; t < T; ++t) {
    x[static_cast<size_t>(t * d)] = 100.0f + static_cast<float>(t % 7);
    x[static_cast<size_t>(t * d + 1)] = 0.01f * static_cast<float>(t % 5);
  }
  const std::vector<float> y = roundtrip(*make_format("int8-asym-ch32-sfp32-zfp32"), x, T, d);
  for (int64_t t = 0; t < T; ++t) {
    CHECK(std::fabs(y[static_cast<size_t>(t * d)] - x[static_cast<size_t>(t * d)]) <= 6.0f / 255.0f / 2 + 1e-4f);
    CHECK(std::fabs(y[static_cast<size_t>(t * d + 1)] - x[static_cast<size_t>(t * d + 1)]) <=
          0.04f / 255.0f / 2 + 1e-6f);
  }
}

TEST_CASE("every int and keep format round-trips finite values (tests/formats/test_format_table.cpp covers the rest)") {
  const int64_t T = 96, d = 64;
  const std::vector<float> x = test::random_normal(static_cast<size_t>(T * d), 5);
  double norm2 = 0;
  for (float v : x) norm2 += double(v) * v;
  for (const FormatFamily& fam : format_families())
    for (const FormatExample& ex : fam.examples) {
      if (fam.name != "int" && fam.name != "keep") continue;
      FormatPtr f = make_format(ex.name);
      if (!f->check_shape(T, d).empty()) continue;
      const std::vector<float> y = roundtrip(*f, x, T, d);
      double err2 = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        REQUIRE(std::isfinite(y[i]));
        err2 += double(y[i] - x[i]) * (y[i] - x[i]);
      }
      INFO(ex);
      CHECK(err2 / norm2 < 1.5);  // sane even at 1 bit (min-max 1-bit is ~1.4 on N(0,1))
      if (f->lossless()) CHECK(err2 == 0.0);
    }
}

TEST_CASE("quantize then dequantize is the round trip, bit for bit; stored codes fit in b bits") {
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* mode : {"sym", "asym"})
      for (const char* grouping : {"g3", "g32", "tok", "ch7", "ch300", "ch"}) {
        const std::string name = "int" + std::to_string(bits) + "-" + mode + "-" + grouping;
        const auto f = std::dynamic_pointer_cast<const IntFormat>(make_format(name));
        REQUIRE(f);
        const int64_t rows = 301, cols = 96;
        std::vector<float> x = test::random_normal(static_cast<size_t>(rows * cols), static_cast<uint64_t>(bits) * 7 + 1);
        for (size_t i = 0; i < x.size(); i += 13) x[i] = (i % 2) ? -0.0f : 0.0f;
        const ConstMatView xv{x.data(), rows, cols, cols};
        const IntCodes codes = f->quantize(xv);
        CHECK(codes.codes.size() == x.size());
        for (uint8_t c : codes.codes) REQUIRE(c < (1u << bits));
        // metadata per group: as many groups as storage_bits counts
        CHECK(codes.params.size() * static_cast<size_t>(f->spec().metadata_bits_per_group()) ==
              f->storage_bits(rows, cols) - static_cast<uint64_t>(rows * cols * bits));
        std::vector<float> a(x.size()), b(x.size());
        f->dequantize(codes, MatView{a.data(), rows, cols, cols});
        f->roundtrip(xv, MatView{b.data(), rows, cols, cols}, SpanInfo{});
        CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, name);
      }
}

TEST_CASE("stored codes map back to the codes they store") {
  for (int bits = 1; bits <= 8; ++bits)
    for (bool sym : {false, true}) {
      const int lo = sym ? (bits == 1 ? -1 : -int_sym_qmax(bits)) : 0;
      const int hi = sym ? int_sym_qmax(bits) : (1 << bits) - 1;
      for (int q = lo; q <= hi; ++q) {
        if (sym && bits == 1 && q == 0) continue;  // the sign quantizer has no 0
        CHECK(int_code_of_stored(int_stored_code(q, bits, sym), bits, sym) == q);
      }
    }
}

TEST_CASE("store_bits and store_bits_value are the stored form of round_to_store") {
  const std::vector<float> x = test::random_normal(4096, 9, 1000.0f);
  for (StoreDtype dt : {StoreDtype::F16, StoreDtype::BF16, StoreDtype::F32})
    for (float v : x) {
      const uint32_t b = store_bits(v, dt);
      if (dt != StoreDtype::F32) REQUIRE(b <= 0xffffu);
      REQUIRE(float_bits(store_bits_value(b, dt)) == float_bits(round_to_store(v, dt)));
    }
}

TEST_CASE("the fused round trip equals dequantize(quantize(x)) bit for bit") {
  // The GPU twins are compared with the fused path (tests/gpu/test_twins.cpp), so it is
  // checked here on the same grid: every width, sym/asym, groups along channels and
  // tokens (partial ones too), every scale/zero storage type, and inputs that saturate
  // or underflow the stored scales.
  const int64_t T = 77, d = 64;  // 77 rows: partial token groups
  std::mt19937_64 rng(29);
  auto input = [&](const std::string& kind) {
    std::vector<float> x = test::random_normal(static_cast<size_t>(T * d), rng(), 3.0f);
    for (size_t i = 0; i < x.size(); ++i) {
      if (kind == "half_steps") x[i] = std::round(x[i] * 4.0f) / 2.0f;            // rounding ties
      else if (kind == "huge") x[i] *= (rng() % 4 == 0) ? 7e4f : 1.0f;             // fp16 scale saturation
      else if (kind == "extreme") x[i] *= (rng() % 8 == 0) ? 1e30f : 1e-3f;
      else if (kind == "subnormal") x[i] *= 1e-40f;
    }
    for (int64_t c = 0; c < d; ++c) x[static_cast<size_t>(5 * d + c)] = 1.5f;                // a constant row
    for (int64_t c = 0; c < d; ++c) x[static_cast<size_t>(6 * d + c)] = c % 2 ? 0.0f : -0.0f;  // signed zeros
    x[7 * d] = 1e-40f;                                                                        // a subnormal
    return x;
  };
  int64_t checked = 0;
  for (const std::string kind : {"normal", "half_steps", "huge", "extreme", "subnormal"}) {
    const std::vector<float> x = input(kind);
    for (int bits = 1; bits <= 8; ++bits)
      for (const std::string mode : {"-sym", "-asym"})
        for (const std::string g : {"-g16", "-g3", "-tok", "-ch8", "-ch7", "-ch"})
          for (const std::string store : {"", "-sbf16", "-sfp32", "-sbf16-zfp32", "-zbf16"}) {
            if (mode == "-sym" && store.find("-z") != std::string::npos) continue;  // no zero point
            const std::string name = "int" + std::to_string(bits) + mode + g + store;
            const auto f = std::dynamic_pointer_cast<const IntFormat>(make_format(name));
            REQUIRE(f);
            const std::vector<float> fused = roundtrip(*f, x, T, d);
            std::vector<float> ref(x.size());
            f->dequantize(f->quantize(ConstMatView{x.data(), T, d, d}), MatView{ref.data(), T, d, d});
            INFO(name << " on " << kind << " input");
            CHECK(std::memcmp(fused.data(), ref.data(), ref.size() * sizeof(float)) == 0);
            ++checked;
          }
  }
  CHECK(checked == 5 * 8 * 6 * (3 + 5));
}

// The fused round trip's arithmetic written out per element with int_block.h: each
// group's statistics folded in order (int_stats_add), then decode(encode(x)). Unlike
// quantize/dequantize (whose stored uint8 codes cannot hold a NaN's code), this defines
// the round trip for every input, NaN and infinities included.
namespace {

std::vector<float> roundtrip_by_element(const IntFormatSpec& s, const std::vector<float>& x, int64_t T, int64_t d) {
  const IntStatKind kind = int_stat_kind(s.symmetric, s.bits);
  const bool along_channels = s.grouping == IntGrouping::Channels || s.grouping == IntGrouping::PerToken;
  const int64_t g = s.group_len(T, d);
  std::vector<float> out(x.size());
  auto params_of = [&](const std::vector<size_t>& members) {
    IntGroupStats st;
    for (size_t i : members) int_stats_add(st, x[i], kind);
    return int_group_params(st, kind, s.bits, s.scale_dtype, s.zero_dtype);
  };
  auto put = [&](const std::vector<size_t>& members) {
    const IntGroupParams p = params_of(members);
    for (size_t i : members) out[i] = int_decode(int_encode(x[i], p, s.bits, s.symmetric), p);
  };
  for (int64_t a = 0; a < (along_channels ? T : d); ++a)
    for (int64_t b0 = 0; b0 < (along_channels ? d : T); b0 += g) {
      std::vector<size_t> members;
      for (int64_t b = b0; b < std::min(along_channels ? d : T, b0 + g); ++b)
        members.push_back(static_cast<size_t>(along_channels ? a * d + b : b * d + a));
      put(members);
    }
  return out;
}

}  // namespace

TEST_CASE("the fused round trip follows the per-element arithmetic on NaN, infinities and signed zeros") {
  // The vectorised statistics fall back to the plain fold where a tie of -0 and +0 or a
  // NaN would make the fold's order matter; rounding and clamping match for any value.
  const int64_t T = 77, d = 64;
  std::mt19937_64 rng(31);
  std::vector<float> x = test::random_normal(static_cast<size_t>(T * d), rng(), 3.0f);
  for (float& v : x)
    if (rng() % 16 == 0) v = (rng() % 3 == 0) ? NAN : (rng() % 2 ? INFINITY : -INFINITY);
  x[0] = NAN;                                                                            // a group that starts with NaN
  for (int64_t c = 0; c < d; ++c) x[static_cast<size_t>(6 * d + c)] = c % 2 ? 0.0f : -0.0f;  // signed zeros
  for (int64_t c = 0; c < d; ++c) x[static_cast<size_t>(8 * d + c)] = c % 3 ? 0.0f : 1.0f;   // a zero minimum
  for (int64_t c = 0; c < d; ++c) x[static_cast<size_t>(9 * d + c)] = c % 3 ? -0.0f : -1.0f;  // a zero maximum
  int64_t checked = 0;
  for (int bits = 1; bits <= 8; ++bits)
    for (const std::string mode : {"-sym", "-asym"})
      for (const std::string g : {"-g16", "-g32", "-g3", "-tok", "-ch8", "-ch7", "-ch"}) {
        const std::string name = "int" + std::to_string(bits) + mode + g;
        const auto f = std::dynamic_pointer_cast<const IntFormat>(make_format(name));
        REQUIRE(f);
        const std::vector<float> fused = roundtrip(*f, x, T, d), ref = roundtrip_by_element(f->spec(), x, T, d);
        // Bit for bit, but for a NaN's sign and payload (the compiler's: it may fold
        // -1 * s into -s).
        int64_t differ = 0;
        for (size_t i = 0; i < ref.size(); ++i)
          differ += !(std::isnan(fused[i]) && std::isnan(ref[i])) && float_bits(fused[i]) != float_bits(ref[i]);
        INFO(name);
        CHECK(differ == 0);
        ++checked;
      }
  CHECK(checked == 8 * 2 * 7);
}
