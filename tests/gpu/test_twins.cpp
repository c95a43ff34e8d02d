// The formats' CUDA twins (kernels/format_twin.h) against the CPU formats, byte for
// byte: codes and group parameters (quantize), dequantized values, and the fused round
// trip, for every format of the table that has a twin, every int variant (all
// groupings including both token-group paths, sym/asym, 1..8 bits, scale/zero dtypes)
// and further variants of the ggml, fp8, fp4 and nf4 families (iq4_nl scale searches,
// every fp8 scale mode, odd NF4 groups and every scale dtype), on random and
// adversarial inputs, aligned and misaligned. The CPU side of codes and metadata is
// Format::encode (the stored representation) split into the twin's layout, or
// IntFormat::quantize for int. Also (no device needed): the twin table agrees with the
// format table's cuda_twin flags (has_cuda_twin).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "gpu_test_util.h"
#include "kernels/device_buffer.h"
#include "kernels/format_twin.h"
#include "sim/core/store_dtype.h"
#include "sim/formats/fp4_format.h"
#include "sim/formats/fp8_format.h"
#include "sim/formats/ggml_format.h"
#include "sim/formats/int_format.h"
#include "sim/formats/keep_format.h"
#include "sim/formats/nf4_format.h"
#include "sim/formats/registry.h"

using namespace kvb;
using kvb::cuda::DeviceBuffer;
using kvb::cuda::SpanBatch;

namespace {

// Every format name the tests cover: the table's examples, a grid of int variants and
// further variants of the block families.
std::vector<std::string> formats_under_test() {
  std::vector<std::string> names;
  for (const FormatFamily& fam : format_families())
    for (const FormatExample& ex : fam.examples) names.push_back(ex.name);
  for (const char* extra : {"iq4_nl-ntry0", "iq4_nl-ntry1", "fp8-e5m2-tok", "fp8-e5m2-s4", "fp8-e4m3-s0.001",
                            "fp8-e4m3-cal1", "fp8-e5m2-cal5000", "nf4-g3", "nf4-g6-sbf16", "nf4-g16", "nf4-g128",
                            "nf4-g2-sfp32", "nf4-g32-sbf16"})
    names.push_back(extra);
  for (int bits = 1; bits <= 8; ++bits)
    for (const char* mode : {"sym", "asym"})
      for (const char* grouping : {"g1", "g3", "g4", "g8", "g32", "g64", "tok", "ch1", "ch7", "ch32", "ch300", "ch"}) {
        const std::string base = "int" + std::to_string(bits) + "-" + mode + "-" + grouping;
        names.push_back(base);
        if (bits == 4 || bits == 1) {
          names.push_back(base + "-sbf16");
          names.push_back(base + "-sfp32");
          if (std::string(mode) == "asym") {
            names.push_back(base + "-sbf16-zfp32");
            names.push_back(base + "-zbf16");
          }
        }
      }
  return names;
}

// Inputs [spans, rows, cols] of one kind.
std::vector<float> make_input(const std::string& kind, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) {
    float v = normal(rng);
    if (kind == "zeros") v = (rng() & 1) ? 0.0f : -0.0f;          // signed zeros only
    else if (kind == "signed_zeros") v = (rng() % 3 == 0) ? ((rng() & 1) ? 0.0f : -0.0f) : v;
    else if (kind == "constant") v = 3.25f;
    else if (kind == "half_steps") v = std::round(v * 4.0f) / 2.0f;  // ties of the rounding
    else if (kind == "huge") v *= (rng() % 4 == 0) ? 7e4f : 1.0f;    // fp16 scale saturation
    else if (kind == "extreme") v *= (rng() % 8 == 0) ? 1e30f : 1e-3f;
    else if (kind == "subnormal") v *= 1e-40f;
    else if (kind == "deep_subnormal") v *= 1e-44f;  // a few ulps: nvfp4's tensor scale underflows
    else if (kind == "outlier") v = (i % 97 == 5) ? v * 300.0f : v;
    else if (kind == "tiny") v *= 1e-16f;  // ggml's GROUP_MAX_EPS path, fp16 scale underflow
    else if (kind == "sign_ties") {        // ±m: ties between +max and -max in every block
      v = std::ldexp(1.5f, static_cast<int>(rng() % 3)) * ((rng() & 1) ? 1.0f : -1.0f);
    } else if (kind == "grid_ties") {  // E2M1 / E4M3 grid points and midpoints (ties to even)
      static const float kGrid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 1.0625f, 1.1875f,
                                    4.0f,  0.5f,  3.0f,  2.0f,  1.0f, 0.0f, 448.0f, 464.0f, 0.001953125f};
      v = kGrid[rng() % (sizeof kGrid / sizeof kGrid[0])] * ((rng() & 1) ? 1.0f : -1.0f);
    } else if (kind == "block_constant") {  // every run of 16 values equal
      v = static_cast<float>(static_cast<int>((i / 16) % 7) - 3) * 0.375f;
    }
    x[i] = v;
  }
  return x;
}

struct Shape {
  int64_t spans, rows, cols;
};

// {1, 3, 9}: an odd element count (NF4 with odd groups packs across groups and spans).
std::vector<Shape> test_shapes() {
  return {{3, 37, 128}, {1, 1000, 64}, {2, 513, 96}, {2, 256, 64}, {1, 5, 12}, {2, 7, 6}, {1, 1, 64}, {1, 3, 9}};
}

// Comparison counters, reported at the end.
struct Tally {
  int64_t formats = 0, cases = 0, bytes = 0;
};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// First differing byte of two buffers, or -1.
int64_t first_difference(const void* a, const void* b, size_t n) {
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  return -1;
}

// CPU reference of a batch: each span's IntCodes (int), stored bits (keep) or
// Format::encode split into codes and metadata (ggml, fp8, fp4, nf4), and its round
// trip, concatenated in the twin's layout (kernels/*_twin.h).
struct Reference {
  std::vector<uint8_t> codes, meta;
  std::vector<float> values;
};

// Reads the fields of a BitWriter stream (little-endian, least significant bit first).
class BitReader {
 public:
  explicit BitReader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  uint64_t get(int nbits) {
    uint64_t v = 0;
    for (int i = 0; i < nbits; ++i, ++pos_) {
      if (pos_ / 8 >= bytes_.size()) FAIL("read past the end of the encoding");
      v |= static_cast<uint64_t>((bytes_[pos_ / 8] >> (pos_ % 8)) & 1u) << i;
    }
    return v;
  }
  void bytes(size_t n, std::vector<uint8_t>& out) {
    for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(get(8)));
  }
  uint64_t pos() const { return pos_; }

 private:
  const std::vector<uint8_t>& bytes_;
  uint64_t pos_ = 0;
};

void append_le(std::vector<uint8_t>& out, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Splits one span's Format::encode stream into the twin's codes and metadata. Fields
// that the twin stores once per batch (NVFP4 tensor scales before the block scales,
// NF4 codes packed over the whole batch) go to `head` / `nibbles` and are assembled by
// the caller.
void split_encoding(const Format& f, const std::vector<uint8_t>& enc, uint64_t bits, Shape s, Reference& ref,
                    std::vector<uint8_t>& head, std::vector<uint8_t>& nibbles) {
  BitReader in(enc);
  if (dynamic_cast<const GgmlFormat*>(&f)) {
    in.bytes(enc.size(), ref.codes);  // ggml's block bytes are the codes
  } else if (const auto* f8 = dynamic_cast<const Fp8Format*>(&f)) {
    if (f8->spec().scale == Fp8Scale::Calibrated) in.bytes(4, ref.meta);
    for (int64_t r = 0; r < s.rows; ++r) {
      if (f8->spec().scale == Fp8Scale::PerToken) in.bytes(4, ref.meta);
      in.bytes(static_cast<size_t>(s.cols), ref.codes);
    }
  } else if (const auto* f4 = dynamic_cast<const Fp4Format*>(&f)) {
    if (f4->nv()) in.bytes(4, head);
    const int64_t blocks = s.rows * s.cols / f4->block();
    for (int64_t b = 0; b < blocks; ++b) {
      in.bytes(1, ref.meta);
      in.bytes(static_cast<size_t>(f4->block() / 2), ref.codes);
    }
  } else if (const auto* nf = dynamic_cast<const Nf4Format*>(&f)) {
    const int sbits = store_dtype_bits(nf->scale_dtype());
    for (int64_t g = 0; g < s.rows * s.cols / nf->group(); ++g) {
      append_le(ref.meta, in.get(sbits), sbits / 8);
      for (int64_t i = 0; i < nf->group(); ++i) nibbles.push_back(static_cast<uint8_t>(in.get(4)));
    }
  } else {
    FAIL("no CPU code reference for format " << f.name());
  }
  CHECK_MESSAGE(in.pos() == bits, f.name() << ": " << in.pos() << " of " << bits << " encoded bits split");
}

Reference cpu_reference(const Format& f, const std::vector<float>& x, Shape s) {
  Reference ref;
  std::vector<uint8_t> head, nibbles;
  ref.values.resize(x.size());
  const int64_t span_elems = s.rows * s.cols;
  for (int64_t sp = 0; sp < s.spans; ++sp) {
    const ConstMatView xv{x.data() + sp * span_elems, s.rows, s.cols, s.cols};
    f.roundtrip(xv, MatView{ref.values.data() + sp * span_elems, s.rows, s.cols, s.cols}, SpanInfo{});
    if (const auto* fi = dynamic_cast<const IntFormat*>(&f)) {
      const IntCodes c = fi->quantize(xv);
      ref.codes.insert(ref.codes.end(), c.codes.begin(), c.codes.end());
      const std::vector<uint8_t> m = as_bytes(c.params);
      ref.meta.insert(ref.meta.end(), m.begin(), m.end());
    } else if (const auto* fk = dynamic_cast<const KeepFormat*>(&f)) {
      for (int64_t e = 0; e < span_elems; ++e) {
        const uint32_t bits = store_bits(xv.data[e], fk->dtype());
        if (fk->dtype() == StoreDtype::F32) {
          const std::vector<uint32_t> w{bits};
          const std::vector<uint8_t> b = as_bytes(w);
          ref.codes.insert(ref.codes.end(), b.begin(), b.end());
        } else {
          const std::vector<uint16_t> w{static_cast<uint16_t>(bits)};
          const std::vector<uint8_t> b = as_bytes(w);
          ref.codes.insert(ref.codes.end(), b.begin(), b.end());
        }
      }
    } else {
      BitWriter w;
      f.encode(xv, SpanInfo{}, w);
      split_encoding(f, w.bytes(), w.bits(), s, ref, head, nibbles);
    }
  }
  if (!head.empty()) ref.meta.insert(ref.meta.begin(), head.begin(), head.end());  // NVFP4 tensor scales first
  for (size_t i = 0; i < nibbles.size(); i += 2)                                  // NF4: packed over the batch
    ref.codes.push_back(static_cast<uint8_t>(nibbles[i] | (i + 1 < nibbles.size() ? nibbles[i + 1] << 4 : 0)));
  return ref;
}

// One format on one input: quantize, dequantize and round trip on the device against
// the CPU reference. `offset` floats shift the device pointers off 16-byte alignment.
void check_twin(const Format& f, const cuda::FormatTwin& twin, const std::vector<float>& x, Shape s, int offset,
                const std::string& label, Tally& tally) {
  const SpanBatch b{s.spans, s.rows, s.cols};
  const Reference ref = cpu_reference(f, x, s);
  const cuda::CodeBytes cb = twin.code_bytes(b);
  REQUIRE_MESSAGE(cb.codes == ref.codes.size(), label << ": code bytes " << cb.codes << " vs CPU " << ref.codes.size());
  REQUIRE_MESSAGE(cb.meta == ref.meta.size(), label << ": metadata bytes " << cb.meta << " vs CPU " << ref.meta.size());

  DeviceBuffer<float> dx(x.size() + offset), dout(x.size() + offset), dround(x.size() + offset);
  DeviceBuffer<uint8_t> dcodes(cb.codes + 16), dmeta(cb.meta + 16);
  dx.upload(x.data(), x.size(), static_cast<size_t>(offset));
  // Poison the outputs so that an unwritten element cannot pass.
  KVB_CUDA_CHECK(cudaMemset(dout.data(), 0xff, dout.bytes()));
  KVB_CUDA_CHECK(cudaMemset(dround.data(), 0xff, dround.bytes()));
  KVB_CUDA_CHECK(cudaMemset(dcodes.data(), 0xa5, dcodes.bytes()));
  KVB_CUDA_CHECK(cudaMemset(dmeta.data(), 0xa5, dmeta.bytes()));
  const size_t code_offset = offset ? 4 : 0;  // codes off 16-byte alignment too (word-aligned)
  uint8_t* codes = dcodes.data() + code_offset;
  twin.quantize(dx.data() + offset, b, codes, dmeta.data(), nullptr);
  twin.dequantize(codes, dmeta.data(), b, dout.data() + offset, nullptr);
  twin.roundtrip(dx.data() + offset, b, dround.data() + offset, nullptr);
  KVB_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint8_t> gcodes = dcodes.download(cb.codes, code_offset);
  const std::vector<uint8_t> gmeta = dmeta.download(cb.meta);
  const std::vector<float> gout = dout.download(x.size(), static_cast<size_t>(offset));
  const std::vector<float> ground = dround.download(x.size(), static_cast<size_t>(offset));
  const int64_t dc = first_difference(gcodes.data(), ref.codes.data(), cb.codes);
  const int64_t dm = first_difference(gmeta.data(), ref.meta.data(), cb.meta);
  const int64_t dv = first_difference(gout.data(), ref.values.data(), x.size() * sizeof(float));
  const int64_t dr = first_difference(ground.data(), ref.values.data(), x.size() * sizeof(float));
  CHECK_MESSAGE(dc < 0, label << ": codes differ first at byte " << dc << " (gpu " << int(gcodes[dc < 0 ? 0 : dc])
                              << ", cpu " << int(ref.codes[dc < 0 ? 0 : dc]) << ")");
  CHECK_MESSAGE(dm < 0, label << ": group parameters differ first at byte " << dm);
  CHECK_MESSAGE(dv < 0, label << ": dequantized values differ first at element " << dv / 4 << " (gpu "
                              << gout[dv < 0 ? 0 : dv / 4] << ", cpu " << ref.values[dv < 0 ? 0 : dv / 4] << ")");
  CHECK_MESSAGE(dr < 0, label << ": round-trip values differ first at element " << dr / 4);
  ++tally.cases;
  tally.bytes += static_cast<int64_t>(cb.codes + cb.meta + 2 * x.size() * sizeof(float));
}

}  // namespace

TEST_SUITE("no_device") {
  TEST_CASE("the twin table and the format table's cuda_twin flags agree on every format of the table") {
    std::set<std::string> families_with_twins;
    for (const cuda::TwinFamily& t : cuda::twin_families()) families_with_twins.insert(t.family);
    std::set<std::string> table_families;
    for (const FormatFamily& fam : format_families()) {
      table_families.insert(fam.name);
      CHECK_MESSAGE(fam.cuda_twin == (families_with_twins.count(fam.name) == 1),
                    fam.name << ": cuda_twin says " << fam.cuda_twin << ", the twin table "
                             << families_with_twins.count(fam.name));
      for (const FormatExample& example : fam.examples) {
        const std::string& ex = example.name;
        const FormatPtr f = make_format(ex);
        const bool has_twin = cuda::make_twin(*f) != nullptr;
        CHECK_MESSAGE(has_cuda_twin(*f) == has_twin,
                      ex << ": has_cuda_twin says " << has_cuda_twin(*f) << ", the twin table " << has_twin);
        if (has_twin) {
          CHECK(cuda::make_twin(*f)->name() == f->name());
          CHECK(families_with_twins.count(fam.name) == 1);
        }
      }
    }
    for (const std::string& fam : families_with_twins)
      CHECK_MESSAGE(table_families.count(fam) == 1, "twin family " << fam << " is not in the format table");
  }

  TEST_CASE("the CPU reference splits into exactly the twin's code and metadata bytes") {
    int64_t checked = 0;
    for (const std::string& name : formats_under_test()) {
      const FormatPtr f = make_format(name);
      if (!has_cuda_twin(*f)) continue;
      const std::unique_ptr<cuda::FormatTwin> twin = cuda::require_twin(*f);  // host only: no device memory
      for (const Shape& s : test_shapes()) {
        if (!f->check_shape(s.rows, s.cols).empty()) continue;
        const Reference ref = cpu_reference(*f, make_input("normal", s.spans * s.rows * s.cols, 7), s);
        const cuda::CodeBytes cb = twin->code_bytes(SpanBatch{s.spans, s.rows, s.cols});
        CHECK_MESSAGE(cb.codes == ref.codes.size(), name << ": code bytes " << cb.codes << " vs CPU " << ref.codes.size());
        CHECK_MESSAGE(cb.meta == ref.meta.size(), name << ": metadata bytes " << cb.meta << " vs CPU " << ref.meta.size());
        ++checked;
      }
    }
    MESSAGE(checked << " (format, shape) pairs");
  }
}

TEST_CASE("every twin's codes, parameters and values are byte-identical to the CPU format") {
  const std::vector<std::string> kinds = {"normal", "zeros",   "signed_zeros", "constant",  "half_steps",
                                          "huge",   "extreme", "subnormal",    "outlier",   "tiny",
                                          "sign_ties", "grid_ties", "block_constant", "deep_subnormal"};
  const std::vector<Shape> shapes = test_shapes();
  Tally tally;
  uint64_t seed = 1;
  const std::vector<std::string> names = formats_under_test();
  std::set<std::string> families_tested;
  std::string without_twin;
  for (const std::string& name : names) {
    const FormatPtr f = make_format(name);
    if (!has_cuda_twin(*f)) {
      without_twin += " " + name;
      continue;
    }
    const std::unique_ptr<cuda::FormatTwin> twin = cuda::require_twin(*f);
    for (const cuda::TwinFamily& t : cuda::twin_families())
      if (t.make(*f)) families_tested.insert(t.family);
    ++tally.formats;
    for (const Shape& s : shapes) {
      if (!f->check_shape(s.rows, s.cols).empty()) continue;
      // Every input kind on one shape per format; the normal input on all of them.
      for (const std::string& kind : kinds) {
        if (kind != "normal" && s.rows != 37) continue;
        const std::vector<float> x = make_input(kind, s.spans * s.rows * s.cols, seed++);
        for (int offset : {0, 1}) {
          if (offset == 1 && kind != "normal") continue;
          const std::string label = name + " [" + std::to_string(s.spans) + "x" + std::to_string(s.rows) + "x" +
                                    std::to_string(s.cols) + "] " + kind + (offset ? " misaligned" : "") +
                                    " seed " + std::to_string(seed - 1);
          check_twin(*f, *twin, x, s, offset, label, tally);
        }
      }
    }
  }
  MESSAGE(tally.formats << " formats, " << tally.cases << " cases, " << tally.bytes
                        << " bytes compared: all byte-identical unless reported above");
  MESSAGE("formats without a CUDA twin (not compared):" << without_twin);
  for (const cuda::TwinFamily& t : cuda::twin_families())
    CHECK_MESSAGE(families_tested.count(t.family) == 1, "no format of twin family " << t.family << " was compared");
}

TEST_CASE("an empty batch is a no-op") {
  for (const char* name : {"int4-asym-ch32", "keep-fp16", "q4_0", "iq4_nl-ntry7", "fp8-e4m3-cal64", "fp8-e5m2-tok",
                           "mxfp4", "nvfp4", "nf4-g64"}) {
    CAPTURE(name);
    const std::unique_ptr<cuda::FormatTwin> twin = cuda::require_twin(*make_format(name));
    twin->roundtrip(nullptr, SpanBatch{1, 0, 64}, nullptr, nullptr);
    twin->quantize(nullptr, SpanBatch{0, 10, 64}, nullptr, nullptr, nullptr);
    twin->dequantize(nullptr, nullptr, SpanBatch{2, 0, 64}, nullptr, nullptr);
    CHECK(twin->code_bytes(SpanBatch{0, 10, 64}).codes == 0);
  }
  KVB_CUDA_CHECK(cudaDeviceSynchronize());
}
