#include "sim/formats/int_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "sim/core/error.h"
#include "sim/formats/int_block.h"
#include "sim/formats/name_parse.h"
#include "sim/metrics/row_simd.h"

namespace kvb {

std::string IntFormatSpec::name() const {
  std::string n = "int" + std::to_string(bits) + (symmetric ? "-sym-" : "-asym-");
  switch (grouping) {
    case IntGrouping::Channels: n += "g" + std::to_string(group); break;
    case IntGrouping::PerToken: n += "tok"; break;
    case IntGrouping::TokensPerChannel: n += "ch" + std::to_string(group); break;
    case IntGrouping::WholeSpanPerChannel: n += "ch"; break;
  }
  if (scale_dtype != StoreDtype::F16) n += std::string("-s") + store_dtype_name(scale_dtype);
  if (!symmetric && zero_dtype != StoreDtype::F16) n += std::string("-z") + store_dtype_name(zero_dtype);
  return n;
}

int IntFormatSpec::metadata_bits_per_group() const {
  return store_dtype_bits(scale_dtype) + (symmetric ? 0 : store_dtype_bits(zero_dtype));
}

int64_t IntFormatSpec::group_len(int64_t tokens, int64_t head_dim) const {
  switch (grouping) {
    case IntGrouping::Channels: return group;
    case IntGrouping::PerToken: return head_dim;
    case IntGrouping::TokensPerChannel: return group;
    case IntGrouping::WholeSpanPerChannel: return tokens;
  }
  return group;
}

uint64_t IntFormat::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  const uint64_t n = static_cast<uint64_t>(tokens * head_dim);
  uint64_t groups = 0;
  switch (spec_.grouping) {
    case IntGrouping::Channels:
      groups = static_cast<uint64_t>(tokens * ((head_dim + spec_.group - 1) / spec_.group));
      break;
    case IntGrouping::PerToken: groups = static_cast<uint64_t>(tokens); break;
    case IntGrouping::TokensPerChannel:
      groups = static_cast<uint64_t>(head_dim * ((tokens + spec_.group - 1) / spec_.group));
      break;
    case IntGrouping::WholeSpanPerChannel: groups = static_cast<uint64_t>(head_dim); break;
  }
  return n * static_cast<uint64_t>(spec_.bits) + groups * static_cast<uint64_t>(spec_.metadata_bits_per_group());
}

std::string IntFormat::check_shape(int64_t /*tokens*/, int64_t head_dim) const {
  if (spec_.grouping == IntGrouping::Channels && head_dim % spec_.group != 0)
    return "group size " + std::to_string(spec_.group) + " does not divide head_dim " + std::to_string(head_dim);
  return {};
}

namespace {

// Groups of channels within each row (g<G>, tok): one group's statistics fed in
// channel order, then its codes.
void quantize_channel_groups(const IntFormatSpec& s, ConstMatView x, IntCodes& out) {
  const IntStatKind kind = int_stat_kind(s.symmetric, s.bits);
  const int64_t g = s.group_len(x.rows, x.cols);
  const int64_t groups_per_row = (x.cols + g - 1) / g;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    uint8_t* codes = out.codes.data() + r * x.cols;
    for (int64_t c0 = 0; c0 < x.cols; c0 += g) {
      const int64_t c1 = std::min(x.cols, c0 + g);
      IntGroupStats st;
      for (int64_t c = c0; c < c1; ++c) int_stats_add(st, xr[c], kind);
      const IntGroupParams p = int_group_params(st, kind, s.bits, s.scale_dtype, s.zero_dtype);
      out.params[static_cast<size_t>(r * groups_per_row + c0 / g)] = p;
      for (int64_t c = c0; c < c1; ++c) codes[c] = int_stored_code(int_encode(xr[c], p, s.bits, s.symmetric), s.bits, s.symmetric);
    }
  }
}

// Per-channel groups of `group` consecutive rows (ch<G>, ch), a block of rows at a
// time so that reads stay contiguous: each channel's statistics are fed in row order.
void quantize_token_groups(const IntFormatSpec& s, ConstMatView x, int64_t group, IntCodes& out) {
  const IntStatKind kind = int_stat_kind(s.symmetric, s.bits);
  const int64_t d = x.cols;
  std::vector<IntGroupStats> stats(static_cast<size_t>(d));
  for (int64_t r0 = 0; r0 < x.rows; r0 += group) {
    const int64_t r1 = std::min(x.rows, r0 + group);
    std::fill(stats.begin(), stats.end(), IntGroupStats{});
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < d; ++c) int_stats_add(stats[c], x.row(r)[c], kind);
    IntGroupParams* params = out.params.data() + (r0 / group) * d;
    for (int64_t c = 0; c < d; ++c) params[c] = int_group_params(stats[c], kind, s.bits, s.scale_dtype, s.zero_dtype);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x.row(r);
      uint8_t* codes = out.codes.data() + r * d;
      for (int64_t c = 0; c < d; ++c) codes[c] = int_stored_code(int_encode(xr[c], params[c], s.bits, s.symmetric), s.bits, s.symmetric);
    }
  }
}

}  // namespace

IntCodes IntFormat::quantize(ConstMatView x) const {
  IntCodes out;
  out.rows = x.rows;
  out.cols = x.cols;
  out.codes.resize(static_cast<size_t>(x.rows * x.cols));
  if (x.rows == 0) return out;
  switch (spec_.grouping) {
    case IntGrouping::Channels:
    case IntGrouping::PerToken: {
      const int64_t g = spec_.group_len(x.rows, x.cols);
      out.params.resize(static_cast<size_t>(x.rows * ((x.cols + g - 1) / g)));
      quantize_channel_groups(spec_, x, out);
      break;
    }
    case IntGrouping::TokensPerChannel:
    case IntGrouping::WholeSpanPerChannel: {
      const int64_t g = spec_.group_len(x.rows, x.cols);
      out.params.resize(static_cast<size_t>(((x.rows + g - 1) / g) * x.cols));
      quantize_token_groups(spec_, x, g, out);
      break;
    }
  }
  return out;
}

IntFormat::GroupLayout IntFormat::group_layout(int64_t rows, int64_t cols) const {
  const int64_t g = spec_.group_len(rows, cols);
  return {g, cols, (cols + g - 1) / g,
          spec_.grouping == IntGrouping::Channels || spec_.grouping == IntGrouping::PerToken};
}

void IntFormat::dequantize(const IntCodes& in, MatView out) const {
  const GroupLayout groups = group_layout(in.rows, in.cols);
  for (int64_t r = 0; r < in.rows; ++r) {
    const uint8_t* codes = in.codes.data() + r * in.cols;
    float* orow = out.row(r);
    for (int64_t c = 0; c < in.cols; ++c)
      orow[c] = int_decode(int_code_of_stored(codes[c], spec_.bits, spec_.symmetric), in.params[groups.of(r, c)]);
  }
}

int64_t IntFormat::clipped_values(ConstMatView x, const SpanInfo& /*span*/) const {
  // Only a group whose stored scale or zero saturated can miss its values: then those
  // beyond its grid (asymmetric: below the zero or above zero + levels·scale;
  // symmetric: beyond ±qmax·scale) come back as the grid's end.
  const IntCodes q = quantize(x);
  const float scale_max = store_dtype_max(spec_.scale_dtype), zero_max = store_dtype_max(spec_.zero_dtype);
  const float top = static_cast<float>(spec_.symmetric ? int_sym_qmax(spec_.bits) : (1 << spec_.bits) - 1);
  const GroupLayout groups = group_layout(x.rows, x.cols);
  int64_t clipped = 0;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) {
      const IntGroupParams p = q.params[groups.of(r, c)];
      if (p.scale < scale_max && std::fabs(p.zero) < zero_max) continue;
      const float v = x.row(r)[c];
      clipped += spec_.symmetric ? std::fabs(v) > top * p.scale : (v < p.zero || v > p.zero + top * p.scale);
    }
  return clipped;
}

namespace {

// The fused round trip: dequantize(quantize(x)) without materializing codes, with
// the statistics fed in the same order and the same KVB_HD arithmetic per element,
// so the result is bit-identical (tests/formats/test_int_format.cpp checks it). Template
// parameters hoist the format's switches out of the per-element loops so that the
// encode/decode loop vectorizes.
template <bool Symmetric>
inline float roundtrip_element(float x, IntGroupParams p, int bits) {
  return int_decode(Symmetric ? int_sym_encode(x, p, bits) : int_asym_encode(x, p, bits), p);
}

// roundtrip_element for b >= 2 without branches, kLanes lanes at a time (a tail through the
// same lane function), the same value for every x, scale and zero:
//   - round_even(q) is (q + 1.5·2^23) - 1.5·2^23 (exact for |q| <= 2^22; beyond, both
//     forms clamp to the same grid end, and a signed zero becomes the same code 0);
//   - a scale that is not > 0 gives code 0, as the encoders' early return does;
//   - the code goes through int as the encoders' return type does (NaN included).
template <bool Symmetric, class V>
inline V roundtrip_lanes(V x, V scale, V zero, float code_lo, float code_hi) {
  const float magic = 12582912.0f;  // 1.5·2^23
  V q = (Symmetric ? x : x + (-zero)) / scale;
  q = (q + magic) - magic;
  if constexpr (std::is_same_v<V, float>) {
    q = clampf(q, code_lo, code_hi);
    const float code = static_cast<float>(static_cast<int>(q));
    return (scale > 0.0f ? code : 0.0f) * scale + zero;
  } else {
    q = q < code_lo ? simd::splat(code_lo) : (q > code_hi ? simd::splat(code_hi) : q);
    const V code = __builtin_convertvector(__builtin_convertvector(q, simd::i32v), V);
    return (scale > 0.0f ? code : simd::splat(0.0f)) * scale + zero;
  }
}

// out[c] = roundtrip_element(x[c]) for c in [0, n), per-channel scale and zero when
// PerChannel (arrays of n), else scale[0] and zero[0] for all.
template <bool Symmetric, bool PerChannel>
void roundtrip_run(const float* x, float* out, int64_t n, const float* scale, const float* zero, float code_lo,
                   float code_hi) {
  using simd::f32v;
  using simd::kLanes;
  int64_t c = 0;
  const f32v s1 = simd::splat(scale[0]), z1 = simd::splat(zero[0]);
  for (; c + kLanes <= n; c += kLanes)
    simd::store(out + c, roundtrip_lanes<Symmetric>(simd::load(x + c), PerChannel ? simd::load(scale + c) : s1,
                                                    PerChannel ? simd::load(zero + c) : z1, code_lo, code_hi));
  for (; c < n; ++c)
    out[c] = roundtrip_lanes<Symmetric>(x[c], PerChannel ? scale[c] : scale[0], PerChannel ? zero[c] : zero[0],
                                        code_lo, code_hi);
}

// The code range of b >= 2 bits: [0, 2^b - 1] asymmetric, [-qmax, qmax] symmetric.
template <bool Symmetric>
inline std::pair<float, float> code_range(int bits) {
  if (Symmetric) return {-static_cast<float>(int_sym_qmax(bits)), static_cast<float>(int_sym_qmax(bits))};
  return {0.0f, static_cast<float>((1u << bits) - 1u)};
}

// The MinMax statistics of x[0, n) as int_stats_add feeds them (min and max keep the
// earliest of equal values), folded kLanes lanes at a time: the result is the fold's
// whenever the minimum and the maximum are unique bit for bit among equal values,
// i.e. neither is a zero (-0 and +0 compare equal) and no NaN is present (the fold
// keeps a leading NaN and skips later ones); otherwise the plain fold.
IntGroupStats minmax_stats(const float* x, int64_t n) {
  using simd::f32v;
  using simd::kLanes;
  IntGroupStats st;
  if (n >= kLanes && n % kLanes == 0) {
    f32v lo = simd::load(x), hi = lo;
    simd::i32v nan = lo != lo;
    for (int64_t c0 = kLanes; c0 < n; c0 += kLanes) {
      const f32v v = simd::load(x + c0);
      lo = v < lo ? v : lo;
      hi = hi < v ? v : hi;
      nan |= v != v;
    }
    float l = lo[0], h = hi[0];
    for (int i = 1; i < kLanes; ++i) {
      l = lo[i] < l ? lo[i] : l;
      h = h < hi[i] ? hi[i] : h;
    }
    if (!simd::any(nan) && l != 0.0f && h != 0.0f) {
      st.lo = l;
      st.hi = h;
      st.n = n;
      return st;
    }
  }
  for (int64_t c = 0; c < n; ++c) int_stats_add(st, x[c], IntStatKind::MinMax);
  return st;
}

// The AbsMax statistics of x[0, n): max |x| never ties between different bit patterns
// (|x| has no -0) and skips NaN in any order, so any fold order gives the fold's value.
IntGroupStats absmax_stats(const float* x, int64_t n) {
  using simd::f32v;
  using simd::kLanes;
  f32v lanes = simd::splat(0.0f);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    const f32v a = (f32v)((simd::i32v)simd::load(x + c) & 0x7fffffff);
    lanes = lanes < a ? a : lanes;
  }
  float m = 0.0f;
  for (; c < n; ++c) {
    const float a = int_abs(x[c]);
    m = m < a ? a : m;
  }
  for (int i = 0; i < kLanes; ++i) m = m < lanes[i] ? lanes[i] : m;
  IntGroupStats st;
  st.absmax = m;
  st.n = n;
  return st;
}

template <IntStatKind Kind>
IntGroupStats group_stats(const float* x, int64_t n) {
  if constexpr (Kind == IntStatKind::MinMax) return minmax_stats(x, n);
  if constexpr (Kind == IntStatKind::AbsMax) return absmax_stats(x, n);
  IntGroupStats st;
  for (int64_t c = 0; c < n; ++c) int_stats_add(st, x[c], Kind);
  return st;
}

template <bool Symmetric, IntStatKind Kind>
void roundtrip_channel_groups(const IntFormatSpec& s, ConstMatView x, MatView out) {
  const int64_t g = s.group_len(x.rows, x.cols);
  const int bits = s.bits;
  const auto [code_lo, code_hi] = code_range<Symmetric>(bits);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float* orow = out.row(r);
    for (int64_t c0 = 0; c0 < x.cols; c0 += g) {
      const int64_t c1 = std::min(x.cols, c0 + g);
      const IntGroupParams p = int_group_params(group_stats<Kind>(xr + c0, c1 - c0), Kind, bits, s.scale_dtype, s.zero_dtype);
      if (Kind == IntStatKind::AbsMean)  // b = 1: the sign quantizer
        for (int64_t c = c0; c < c1; ++c) orow[c] = roundtrip_element<Symmetric>(xr[c], p, bits);
      else
        roundtrip_run<Symmetric, false>(xr + c0, orow + c0, c1 - c0, &p.scale, &p.zero, code_lo, code_hi);
    }
  }
}

// Groups along tokens: each channel's statistics folded in row order, channels side by
// side (the fold of int_stats_add per channel, in arrays so that it vectorizes). One
// group at a time: fold its rows (in one or more calls, in row order), fit, apply.
template <bool Symmetric, IntStatKind Kind>
class TokenGroupFold {
 public:
  TokenGroupFold(const IntFormatSpec& s, int64_t d)
      : s_(s), d_(d), stats_(static_cast<size_t>(d)), params_(static_cast<size_t>(d)), lo_(static_cast<size_t>(d)),
        hi_(static_cast<size_t>(d)), scale_(static_cast<size_t>(d)), zero_(static_cast<size_t>(d)) {}

  // Folds rows [r0, r1) into the channels' statistics; `first`: they start the group.
  void fold(ConstMatView x, int64_t r0, int64_t r1, bool first) {
    const int64_t d = d_;
    if (first) rows_ = 0;
    rows_ += r1 - r0;
    if constexpr (Kind == IntStatKind::MinMax) {
      if (first && r0 < r1) {
        std::copy(x.row(r0), x.row(r0) + d, lo_.begin());
        std::copy(x.row(r0), x.row(r0) + d, hi_.begin());
        ++r0;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.row(r);
        int64_t c = 0;
        for (; c + simd::kLanes <= d; c += simd::kLanes) {
          const simd::f32v v = simd::load(xr + c), l = simd::load(lo_.data() + c), h = simd::load(hi_.data() + c);
          simd::store(lo_.data() + c, v < l ? v : l);
          simd::store(hi_.data() + c, h < v ? v : h);
        }
        for (; c < d; ++c) {
          lo_[c] = xr[c] < lo_[c] ? xr[c] : lo_[c];
          hi_[c] = hi_[c] < xr[c] ? xr[c] : hi_[c];
        }
      }
    } else if constexpr (Kind == IntStatKind::AbsMax) {
      if (first) std::fill(hi_.begin(), hi_.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.row(r);
        int64_t c = 0;
        for (; c + simd::kLanes <= d; c += simd::kLanes) {
          const simd::f32v a = (simd::f32v)((simd::i32v)simd::load(xr + c) & 0x7fffffff);
          const simd::f32v h = simd::load(hi_.data() + c);
          simd::store(hi_.data() + c, h < a ? a : h);
        }
        for (; c < d; ++c) {
          const float a = int_abs(xr[c]);
          hi_[c] = hi_[c] < a ? a : hi_[c];
        }
      }
    } else {
      if (first) std::fill(stats_.begin(), stats_.end(), IntGroupStats{});
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < d; ++c) int_stats_add(stats_[c], x.row(r)[c], Kind);
    }
  }

  // The channels' stored scale and zero from the rows folded so far.
  void fit() {
    for (int64_t c = 0; c < d_; ++c) {
      if constexpr (Kind == IntStatKind::MinMax) {
        stats_[c].lo = lo_[c];
        stats_[c].hi = hi_[c];
        stats_[c].n = rows_;
      } else if constexpr (Kind == IntStatKind::AbsMax) {
        stats_[c].absmax = hi_[c];
        stats_[c].n = rows_;
      }
      params_[c] = int_group_params(stats_[c], Kind, s_.bits, s_.scale_dtype, s_.zero_dtype);
      scale_[c] = params_[c].scale;
      zero_[c] = params_[c].zero;
    }
  }

  // Rows [r0, r1) of x through the fitted scales and zeros into out's same rows.
  void apply(ConstMatView x, int64_t r0, int64_t r1, MatView out) const {
    const auto [code_lo, code_hi] = code_range<Symmetric>(s_.bits);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x.row(r);
      float* orow = out.row(r);
      if (Kind == IntStatKind::AbsMean)
        for (int64_t c = 0; c < d_; ++c) orow[c] = roundtrip_element<Symmetric>(xr[c], params_[c], s_.bits);
      else
        roundtrip_run<Symmetric, true>(xr, orow, d_, scale_.data(), zero_.data(), code_lo, code_hi);
    }
  }

  // Whether the fitted scales and zeros are, bit for bit, those of `other`'s fit.
  bool same_fit(const TokenGroupFold& other) const {
    return std::memcmp(params_.data(), other.params_.data(), params_.size() * sizeof(IntGroupParams)) == 0;
  }

 private:
  const IntFormatSpec& s_;
  int64_t d_, rows_ = 0;
  std::vector<IntGroupStats> stats_;
  std::vector<IntGroupParams> params_;
  std::vector<float> lo_, hi_, scale_, zero_;
};

template <bool Symmetric, IntStatKind Kind>
void roundtrip_token_groups(const IntFormatSpec& s, ConstMatView x, MatView out, int64_t group) {
  TokenGroupFold<Symmetric, Kind> fold(s, x.cols);
  for (int64_t r0 = 0; r0 < x.rows; r0 += group) {
    const int64_t r1 = std::min(x.rows, r0 + group);
    fold.fold(x, r0, r1, true);
    fold.fit();
    fold.apply(x, r0, r1, out);
  }
}

// int ch (one group over the whole span) grown from its first m rows: only the new rows
// when every channel's fit over the whole span is the first m rows' fit, else every row
// (the whole span's fold is the first m rows' fold continued). Returns the first row written.
template <bool Symmetric, IntStatKind Kind>
int64_t grow_whole_span_group(const IntFormatSpec& s, ConstMatView x, int64_t m, MatView out) {
  TokenGroupFold<Symmetric, Kind> prefix(s, x.cols);
  prefix.fold(x, 0, m, true);
  TokenGroupFold<Symmetric, Kind> whole = prefix;
  prefix.fit();
  whole.fold(x, m, x.rows, m == 0);
  whole.fit();
  if (!whole.same_fit(prefix)) m = 0;
  whole.apply(x, m, x.rows, out);
  return m;
}

template <bool Symmetric, IntStatKind Kind>
void roundtrip_fused(const IntFormatSpec& s, ConstMatView x, MatView out) {
  if (s.grouping == IntGrouping::Channels || s.grouping == IntGrouping::PerToken)
    roundtrip_channel_groups<Symmetric, Kind>(s, x, out);
  else
    roundtrip_token_groups<Symmetric, Kind>(s, x, out, s.group_len(x.rows, x.cols));
}

}  // namespace

void IntFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  if (x.rows == 0) return;
  switch (int_stat_kind(spec_.symmetric, spec_.bits)) {
    case IntStatKind::MinMax: roundtrip_fused<false, IntStatKind::MinMax>(spec_, x, out); break;
    case IntStatKind::AbsMax: roundtrip_fused<true, IntStatKind::AbsMax>(spec_, x, out); break;
    case IntStatKind::AbsMean: roundtrip_fused<true, IntStatKind::AbsMean>(spec_, x, out); break;
  }
}

int64_t IntFormat::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                                  GrowthMemo* memo) const {
  m = std::clamp<int64_t>(m, 0, x.rows);
  if (spec_.grouping != IntGrouping::WholeSpanPerChannel || x.rows == 0)
    return Format::roundtrip_grown(x, m, out, span, memo);
  switch (int_stat_kind(spec_.symmetric, spec_.bits)) {
    case IntStatKind::MinMax: return grow_whole_span_group<false, IntStatKind::MinMax>(spec_, x, m, out);
    case IntStatKind::AbsMax: return grow_whole_span_group<true, IntStatKind::AbsMax>(spec_, x, m, out);
    case IntStatKind::AbsMean: return grow_whole_span_group<true, IntStatKind::AbsMean>(spec_, x, m, out);
  }
  return Format::roundtrip_grown(x, m, out, span, memo);
}

FormatPtr parse_int_format(std::string_view name) {
  NameParts parts(name);
  if (!parts.head_starts_with("int")) return nullptr;
  IntFormatSpec s;
  const std::string where = "format '" + std::string(name) + "'";
  const auto bits = parse_int_suffix(parts.at(0), "int");
  if (!bits) return nullptr;  // e.g. "intx": not this family
  if (*bits < 1 || *bits > 8) throw ConfigError(where + ": integer bits must be 1..8, got " + std::to_string(*bits));
  s.bits = static_cast<int>(*bits);
  if (parts.size() < 3)
    throw ConfigError(where + ": expected int<b>-<sym|asym>-<g<G>|tok|ch<G>|ch>, e.g. int4-asym-g32");
  if (parts.at(1) == "sym") s.symmetric = true;
  else if (parts.at(1) == "asym") s.symmetric = false;
  else throw ConfigError(where + ": mode must be 'sym' or 'asym', got '" + std::string(parts.at(1)) + "'");

  const std::string_view g = parts.at(2);
  if (g == "tok") {
    s.grouping = IntGrouping::PerToken;
  } else if (g == "ch") {
    s.grouping = IntGrouping::WholeSpanPerChannel;
  } else if (auto n = parse_int_suffix(g, "ch")) {
    s.grouping = IntGrouping::TokensPerChannel;
    s.group = *n;
  } else if (auto m = parse_int_suffix(g, "g")) {
    s.grouping = IntGrouping::Channels;
    s.group = *m;
  } else {
    throw ConfigError(where + ": grouping must be g<G>, tok, ch<G> or ch, got '" + std::string(g) + "'");
  }
  if ((s.grouping == IntGrouping::Channels || s.grouping == IntGrouping::TokensPerChannel) && s.group < 1)
    throw ConfigError(where + ": group size must be >= 1");

  for (size_t i = 3; i < parts.size(); ++i) {
    const std::string_view opt = parts.at(i);
    StoreDtype dt;
    if (opt.size() > 1 && opt[0] == 's' && parse_store_dtype(opt.substr(1), dt)) {
      s.scale_dtype = dt;
    } else if (opt.size() > 1 && opt[0] == 'z' && parse_store_dtype(opt.substr(1), dt)) {
      if (s.symmetric) throw ConfigError(where + ": symmetric formats store no zero; drop '-" + std::string(opt) + "'");
      s.zero_dtype = dt;
    } else {
      throw ConfigError(where + ": unknown option '-" + std::string(opt) +
                        "' (expected -s<fp16|bf16|fp32> or -z<fp16|bf16|fp32>)");
    }
  }
  return std::make_shared<IntFormat>(s);
}

// The layout code_layout() describes, written from quantize()'s codes and parameters.
void IntFormat::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  if (x.rows == 0) return;
  const IntFormatSpec& s = spec_;
  const IntCodes q = quantize(x);
  auto put_params = [&](const IntGroupParams& p) {
    out.put(store_bits(p.scale, s.scale_dtype), store_dtype_bits(s.scale_dtype));
    if (!s.symmetric) out.put(store_bits(p.zero, s.zero_dtype), store_dtype_bits(s.zero_dtype));
  };
  if (s.grouping == IntGrouping::Channels || s.grouping == IntGrouping::PerToken) {
    const int64_t g = s.group_len(x.rows, x.cols), per_row = (x.cols + g - 1) / g;
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c0 = 0; c0 < x.cols; c0 += g) {
        put_params(q.params[static_cast<size_t>(r * per_row + c0 / g)]);
        for (int64_t c = c0; c < std::min(x.cols, c0 + g); ++c) out.put(q.codes[static_cast<size_t>(r * x.cols + c)], s.bits);
      }
    return;
  }
  const int64_t g = s.grouping == IntGrouping::TokensPerChannel ? s.group : x.rows;
  for (int64_t r0 = 0, block = 0; r0 < x.rows; r0 += g, ++block) {
    for (int64_t c = 0; c < x.cols; ++c) put_params(q.params[static_cast<size_t>(block * x.cols + c)]);
    for (int64_t r = r0; r < std::min(x.rows, r0 + g); ++r)
      for (int64_t c = 0; c < x.cols; ++c) out.put(q.codes[static_cast<size_t>(r * x.cols + c)], s.bits);
  }
}

std::string IntFormat::code_layout() const {
  const std::string meta = std::string(store_dtype_name(spec_.scale_dtype)) + " scale" +
                           (spec_.symmetric ? "" : std::string(", ") + store_dtype_name(spec_.zero_dtype) + " zero (group min)");
  const std::string code = spec_.symmetric ? "b-bit code q + qmax (b = 1: 1 for +s, 0 for -s)" : "b-bit code";
  if (spec_.grouping == IntGrouping::Channels || spec_.grouping == IntGrouping::PerToken)
    return "per row, per group of channels: " + meta + ", then one " + code + " per value";
  return "per block of rows (group along tokens): per channel " + meta + "; then the block's rows, one " + code +
         " per value";
}

}  // namespace kvb
