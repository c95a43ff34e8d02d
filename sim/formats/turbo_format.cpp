#include "sim/formats/turbo_format.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/formats/hadamard.h"
#include "sim/formats/lloyd_max.h"
#include "sim/formats/name_parse.h"
#include "sim/formats/seeded.h"
#include "sim/formats/turbo_block.h"

namespace kvb {

std::string TurboSpec::name() const {
  std::string n = "turbo-" + std::to_string(bits);
  if (split()) {
    n += "-o" + (outliers > 0 ? std::to_string(outliers) : name_number(outlier_percent) + "%") + "b" +
         std::to_string(outlier_bits);
    if (calibration_tokens != 128) n += "-cal" + std::to_string(calibration_tokens);
  }
  return n;
}

int64_t TurboSpec::outlier_count(int64_t head_dim) const {
  if (outliers > 0) return outliers;
  return static_cast<int64_t>(std::floor(static_cast<double>(outlier_percent) * static_cast<double>(head_dim) / 100.0 + 0.5));
}

uint64_t turbo_sign_stream(const SpanInfo& span, int part) {
  return unit_stream(span.seed, span.layer, span.kv_head, span.is_key, 0x747572626f00ull + static_cast<uint64_t>(part));
}

std::vector<TurboPart> TurboFormat::parts(int64_t head_dim) const {
  std::vector<TurboPart> out;
  if (!spec_.split()) {
    if (is_power_of_two(head_dim)) out.push_back({0, head_dim, spec_.bits});
    return out;
  }
  const int64_t n = spec_.outlier_count(head_dim);
  if (n >= head_dim || !is_power_of_two(n)) return out;
  out.push_back({0, n, spec_.outlier_bits});
  int64_t offset = n, rest = head_dim - n;
  for (int64_t p = int64_t{1} << 62; p > 0; p >>= 1)
    if (rest & p) {
      out.push_back({offset, p, spec_.bits});
      offset += p;
    }
  return out;
}

std::string TurboFormat::check_shape(int64_t /*tokens*/, int64_t head_dim) const {
  if (!spec_.split()) {
    if (!is_power_of_two(head_dim))
      return "head_dim " + std::to_string(head_dim) + " is not a power of two (the Walsh-Hadamard rotation needs one)";
    return {};
  }
  const int64_t n = spec_.outlier_count(head_dim);
  if (n >= head_dim || n < 1)
    return std::to_string(n) + " outlier channels do not split head_dim " + std::to_string(head_dim);
  if (!is_power_of_two(n))
    return std::to_string(n) + " outlier channels of head_dim " + std::to_string(head_dim) +
           " are not a power of two (each part needs a Walsh-Hadamard rotation)";
  return {};
}

uint64_t TurboFormat::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  uint64_t per_row = 0;
  for (const TurboPart& p : parts(head_dim)) per_row += static_cast<uint64_t>(p.size * p.bits + 16);
  const uint64_t mask = spec_.split() ? static_cast<uint64_t>(head_dim) : 0u;
  return static_cast<uint64_t>(tokens) * per_row + mask;
}

std::vector<int32_t> TurboFormat::channel_order(ConstMatView x) const {
  std::vector<int32_t> order(static_cast<size_t>(x.cols));
  std::iota(order.begin(), order.end(), 0);
  if (!spec_.split()) return order;
  const int64_t n = spec_.outlier_count(x.cols);
  std::vector<double> energy(static_cast<size_t>(x.cols), 0.0);
  const int64_t rows = std::min(x.rows, spec_.calibration_tokens);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) energy[c] += static_cast<double>(x.row(r)[c]) * x.row(r)[c];
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return energy[a] > energy[b]; });
  std::sort(order.begin(), order.begin() + n);
  std::sort(order.begin() + n, order.end());
  return order;
}

template <class Fn>
void TurboFormat::run(ConstMatView x, const SpanInfo& span, bool decode, const std::vector<int32_t>& order,
                      Fn fn) const {
  const std::vector<TurboPart> ps = parts(x.cols);
  if (ps.empty()) throw Error("format '" + name() + "': " + check_shape(x.rows, x.cols));
  struct PartState {
    TurboPart part;
    const LloydMaxCodebook* book;
    std::vector<float> signs;
  };
  std::vector<PartState> states;
  for (size_t p = 0; p < ps.size(); ++p) {
    PartState s{ps[p], &lloyd_max_gaussian(ps[p].bits), std::vector<float>(static_cast<size_t>(ps[p].size))};
    const uint64_t stream = turbo_sign_stream(span, static_cast<int>(p));
    for (int64_t i = 0; i < ps[p].size; ++i) s.signs[i] = stream_sign(stream, static_cast<uint64_t>(i));
    states.push_back(std::move(s));
  }
  const size_t d = static_cast<size_t>(x.cols);
  std::vector<float> v(d), work(d), dec(d);
  std::vector<uint8_t> codes(d);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    for (size_t p = 0; p < states.size(); ++p) {
      const PartState& s = states[p];
      const int n = static_cast<int>(s.part.size);
      const int32_t* ch = order.data() + s.part.offset;
      for (int i = 0; i < n; ++i) v[i] = xr[ch[i]];
      const int levels = 1 << s.part.bits;
      const uint16_t norm =
          turbo_encode(v.data(), n, s.signs.data(), s.book->thresholds.data(), levels, work.data(), codes.data());
      if (decode) turbo_decode(codes.data(), n, norm, s.signs.data(), s.book->centroids.data(), dec.data());
      fn(r, s.part, norm, codes.data(), dec.data(), ch);
    }
  }
}

void TurboFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const {
  const std::vector<int32_t> order = channel_order(x);
  run(x, span, true, order,
      [&](int64_t r, const TurboPart& part, uint16_t, const uint8_t*, const float* dec, const int32_t* ch) {
        float* o = out.row(r);
        for (int64_t i = 0; i < part.size; ++i) o[ch[i]] = dec[i];
      });
}

void TurboFormat::encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const {
  const std::vector<int32_t> order = channel_order(x);
  if (spec_.split()) {
    std::vector<bool> is_outlier(static_cast<size_t>(x.cols), false);
    for (int64_t i = 0; i < spec_.outlier_count(x.cols); ++i) is_outlier[order[i]] = true;
    for (int64_t c = 0; c < x.cols; ++c) out.put(is_outlier[c] ? 1u : 0u, 1);
  }
  run(x, span, false, order,
      [&](int64_t, const TurboPart& part, uint16_t norm, const uint8_t* codes, const float*, const int32_t*) {
        out.put(norm, 16);
        for (int64_t i = 0; i < part.size; ++i) out.put(codes[i], part.bits);
      });
}

std::string TurboFormat::code_layout() const {
  std::string s;
  if (spec_.split())
    s = "head_dim-bit outlier channel mask (bit c set: channel c is an outlier), then ";
  s += "per row, per part (outlier channels first, then the others in power-of-two parts, channels ascending): "
       "fp16 norm of the part, then one code per rotated coordinate (b bits, index into the N(0,1) Lloyd-Max "
       "codebook, ascending order)";
  return s;
}

FormatPtr parse_turbo_format(std::string_view name) {
  NameParts parts(name);
  if (parts.at(0) != "turbo") return nullptr;
  const std::string where = "format '" + std::string(name) + "'";
  const auto b = parse_int_suffix(parts.at(1), "");
  if (!b || *b < 1 || *b > 8)
    throw ConfigError(where + ": expected turbo-<b>[-o<n>b<B>[-cal<N>]] with b in 1..8 (e.g. turbo-3, turbo-2-o64b3)");
  TurboSpec s;
  s.bits = static_cast<int>(*b);
  if (parts.size() >= 3) {
    const std::string_view o = parts.at(2);
    const size_t bpos = o.rfind('b');
    const std::string_view count = bpos == std::string_view::npos || o.size() < 2 ? std::string_view{} : o.substr(1, bpos - 1);
    const auto bb = bpos == std::string_view::npos ? std::nullopt : parse_int_suffix(o.substr(bpos), "b");
    if (o.empty() || o[0] != 'o' || count.empty() || !bb)
      throw ConfigError(where + ": expected an outlier split -o<n>b<B> or -o<p>%b<B> (e.g. -o32b3, -o50%b3), got '-" +
                        std::string(o) + "'");
    if (count.back() == '%') {
      const auto p = parse_name_number(count.substr(0, count.size() - 1));
      if (!p || !(*p > 0.0f) || !(*p < 100.0f))
        throw ConfigError(where + ": the outlier share must be a percentage in (0, 100), got '" + std::string(count) + "'");
      s.outlier_percent = *p;
    } else {
      const auto n = parse_int_suffix(count, "");
      if (!n || *n < 1 || !is_power_of_two(*n))
        throw ConfigError(where + ": the number of outlier channels must be a power of two, got '" + std::string(count) + "'");
      s.outliers = *n;
    }
    if (*bb < 1 || *bb > 8) throw ConfigError(where + ": outlier bits must be 1..8, got " + std::to_string(*bb));
    s.outlier_bits = static_cast<int>(*bb);
  }
  if (parts.size() >= 4) {
    const auto cal = parse_int_suffix(parts.at(3), "cal");
    if (!cal || *cal < 1) throw ConfigError(where + ": expected -cal<N> with N >= 1 calibration tokens");
    s.calibration_tokens = *cal;
  }
  if (parts.size() > 4) throw ConfigError(where + ": too many options");
  return std::make_shared<TurboFormat>(s);
}

}  // namespace kvb
