#include "sim/formats/int_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "sim/core/error.h"
#include "sim/formats/int_block.h"
#include "sim/formats/name_parse.h"

namespace kvb {

const char* store_dtype_name(StoreDtype d) {
  switch (d) {
    case StoreDtype::F16: return "fp16";
    case StoreDtype::BF16: return "bf16";
    default: return "fp32";
  }
}

bool parse_store_dtype(std::string_view s, StoreDtype& out) {
  if (s == "fp16" || s == "f16") out = StoreDtype::F16;
  else if (s == "bf16") out = StoreDtype::BF16;
  else if (s == "fp32" || s == "f32") out = StoreDtype::F32;
  else return false;
  return true;
}

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

uint64_t stored_bits(float v, StoreDtype d) {
  switch (d) {
    case StoreDtype::F16: return f32_to_f16_bits(v);
    case StoreDtype::BF16: return f32_to_bf16_bits(v);
    default: return float_bits(v);
  }
}

// Group parameters exactly as roundtrip_group / roundtrip_token_groups compute them.
IntGroupParams group_params(const IntFormatSpec& s, const float* x, int64_t stride, int64_t n) {
  if (s.symmetric) {
    float stat = 0;
    if (s.bits == 1) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += std::fabs(x[i * stride]);
      stat = static_cast<float>(sum / static_cast<double>(n));
    } else {
      for (int64_t i = 0; i < n; ++i) stat = std::max(stat, std::fabs(x[i * stride]));
    }
    return int_sym_params(stat, s.bits, s.scale_dtype);
  }
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  return int_asym_params(lo, hi, s.bits, s.scale_dtype, s.zero_dtype);
}

// The stored (unsigned) code: symmetric codes are offset by qmax (b = 1: 0 = -1, 1 = +1).
uint64_t stored_code(const IntFormatSpec& s, float x, IntGroupParams p) {
  if (!s.symmetric) return static_cast<uint64_t>(int_asym_encode(x, p, s.bits));
  const int q = int_sym_encode(x, p, s.bits);
  return s.bits == 1 ? (q > 0 ? 1u : 0u) : static_cast<uint64_t>(q + int_sym_qmax(s.bits));
}

void put_params(const IntFormatSpec& s, IntGroupParams p, BitWriter& out) {
  out.put(stored_bits(p.scale, s.scale_dtype), store_dtype_bits(s.scale_dtype));
  if (!s.symmetric) out.put(stored_bits(p.zero, s.zero_dtype), store_dtype_bits(s.zero_dtype));
}

}  // namespace

namespace {

// Quantize-dequantize one group of n values read with a stride (in floats).
// The same two passes as the CUDA twin: statistics, then encode/decode.
inline void roundtrip_group(const IntFormatSpec& s, const float* x, int64_t stride, int64_t n, float* out,
                            int64_t out_stride) {
  const IntGroupParams p = group_params(s, x, stride, n);
  if (s.symmetric)
    for (int64_t i = 0; i < n; ++i) out[i * out_stride] = int_decode(int_sym_encode(x[i * stride], p, s.bits), p);
  else
    for (int64_t i = 0; i < n; ++i) out[i * out_stride] = int_decode(int_asym_encode(x[i * stride], p, s.bits), p);
}

// Per-channel groups along tokens, processed a block of rows at a time so that reads
// stay contiguous: statistics per channel over the block, then encode row by row.
void roundtrip_token_groups(const IntFormatSpec& s, ConstMatView x, MatView out, int64_t group) {
  const int64_t d = x.cols;
  std::vector<float> lo(static_cast<size_t>(d)), hi(static_cast<size_t>(d));
  std::vector<IntGroupParams> params(static_cast<size_t>(d));
  std::vector<double> sum(static_cast<size_t>(d));
  for (int64_t r0 = 0; r0 < x.rows; r0 += group) {
    const int64_t r1 = std::min(x.rows, r0 + group);
    if (s.symmetric && s.bits == 1) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < d; ++c) sum[c] += std::fabs(x.row(r)[c]);
      for (int64_t c = 0; c < d; ++c)
        params[c] = int_sym_params(static_cast<float>(sum[c] / static_cast<double>(r1 - r0)), 1, s.scale_dtype);
    } else if (s.symmetric) {
      std::fill(hi.begin(), hi.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < d; ++c) hi[c] = std::max(hi[c], std::fabs(x.row(r)[c]));
      for (int64_t c = 0; c < d; ++c) params[c] = int_sym_params(hi[c], s.bits, s.scale_dtype);
    } else {
      std::copy(x.row(r0), x.row(r0) + d, lo.begin());
      std::copy(x.row(r0), x.row(r0) + d, hi.begin());
      for (int64_t r = r0 + 1; r < r1; ++r)
        for (int64_t c = 0; c < d; ++c) {
          lo[c] = std::min(lo[c], x.row(r)[c]);
          hi[c] = std::max(hi[c], x.row(r)[c]);
        }
      for (int64_t c = 0; c < d; ++c) params[c] = int_asym_params(lo[c], hi[c], s.bits, s.scale_dtype, s.zero_dtype);
    }
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x.row(r);
      float* orow = out.row(r);
      if (s.symmetric)
        for (int64_t c = 0; c < d; ++c) orow[c] = int_decode(int_sym_encode(xr[c], params[c], s.bits), params[c]);
      else
        for (int64_t c = 0; c < d; ++c) orow[c] = int_decode(int_asym_encode(xr[c], params[c], s.bits), params[c]);
    }
  }
}

}  // namespace

void IntFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  if (x.rows == 0) return;
  switch (spec_.grouping) {
    case IntGrouping::Channels:
    case IntGrouping::PerToken: {
      const int64_t g = spec_.group_len(x.rows, x.cols);
      for (int64_t r = 0; r < x.rows; ++r)
        for (int64_t c0 = 0; c0 < x.cols; c0 += g)
          roundtrip_group(spec_, x.row(r) + c0, 1, std::min(g, x.cols - c0), out.row(r) + c0, 1);
      break;
    }
    case IntGrouping::TokensPerChannel: roundtrip_token_groups(spec_, x, out, spec_.group); break;
    case IntGrouping::WholeSpanPerChannel: roundtrip_token_groups(spec_, x, out, x.rows); break;
  }
}

void IntFormat::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  if (x.rows == 0) return;
  const IntFormatSpec& s = spec_;
  if (s.grouping == IntGrouping::Channels || s.grouping == IntGrouping::PerToken) {
    const int64_t g = s.group_len(x.rows, x.cols);
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c0 = 0; c0 < x.cols; c0 += g) {
        const int64_t n = std::min(g, x.cols - c0);
        const IntGroupParams p = group_params(s, x.row(r) + c0, 1, n);
        put_params(s, p, out);
        for (int64_t i = 0; i < n; ++i) out.put(stored_code(s, x.row(r)[c0 + i], p), s.bits);
      }
    return;
  }
  const int64_t g = s.grouping == IntGrouping::TokensPerChannel ? s.group : x.rows;
  std::vector<IntGroupParams> params(static_cast<size_t>(x.cols));
  for (int64_t r0 = 0; r0 < x.rows; r0 += g) {
    const int64_t r1 = std::min(x.rows, r0 + g);
    for (int64_t c = 0; c < x.cols; ++c) {
      params[c] = group_params(s, x.row(r0) + c, x.stride, r1 - r0);
      put_params(s, params[c], out);
    }
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < x.cols; ++c) out.put(stored_code(s, x.row(r)[c], params[c]), s.bits);
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

}  // namespace kvb
