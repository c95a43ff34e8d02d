#include "sim/formats/nuq_format.h"

#include <algorithm>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/codebook.h"
#include "sim/formats/name_parse.h"

namespace kvb {

std::string NuqSpec::name() const {
  std::string n = "nuq" + std::to_string(bits);
  if (calibration_tokens > 0) n += "-cal" + std::to_string(calibration_tokens);
  if (weighted) n += "-wsq";
  return n;
}

std::vector<double> fit_kmeans_1d(std::vector<float>& samples, int bits, bool weighted, int max_iterations) {
  const int K = 1 << bits;
  const size_t n = samples.size();
  std::vector<double> c(static_cast<size_t>(K), 0.0);
  if (n == 0) return c;
  std::sort(samples.begin(), samples.end());
  for (int k = 0; k < K; ++k)
    c[k] = samples[std::min(n - 1, static_cast<size_t>((k + 0.5) * static_cast<double>(n) / K))];
  // end[k]: one past the last sample of cell k (samples x with t_{k-1} < x <= t_k).
  std::vector<size_t> end(static_cast<size_t>(K)), prev_end;
  for (int it = 0; it < max_iterations; ++it) {
    size_t pos = 0;
    for (int k = 0; k < K; ++k) {
      if (k == K - 1) {
        pos = n;
      } else {
        const double t = 0.5 * (c[k] + c[k + 1]);
        pos = static_cast<size_t>(
            std::upper_bound(samples.begin() + static_cast<std::ptrdiff_t>(pos), samples.end(), t,
                             [](double v, float s) { return v < static_cast<double>(s); }) -
            samples.begin());
      }
      end[k] = pos;
    }
    if (end == prev_end) break;
    size_t begin = 0;
    for (int k = 0; k < K; ++k) {
      double sum = 0, wsum = 0;
      for (size_t i = begin; i < end[k]; ++i) {
        const double x = samples[i];
        const double w = weighted ? x * x : 1.0;
        sum += w * x;
        wsum += w;
      }
      if (wsum > 0) c[k] = sum / wsum;
      else if (end[k] > begin) c[k] = 0.0;  // weighted cell of zeros
      begin = end[k];
    }
    prev_end = end;
  }
  return c;
}

ChannelCodebook make_channel_codebook(const std::vector<double>& centroids) {
  ChannelCodebook cb;
  for (double v : centroids) cb.values.push_back(round_to_f16(static_cast<float>(v)));
  std::sort(cb.values.begin(), cb.values.end());
  for (size_t k = 0; k + 1 < cb.values.size(); ++k)
    cb.thresholds.push_back(
        static_cast<float>((static_cast<double>(cb.values[k]) + static_cast<double>(cb.values[k + 1])) / 2.0));
  return cb;
}

uint64_t NuqFormat::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  return static_cast<uint64_t>(tokens * head_dim) * static_cast<uint64_t>(spec_.bits) +
         static_cast<uint64_t>(head_dim) * (uint64_t{1} << spec_.bits) * 16u;
}

std::vector<ChannelCodebook> NuqFormat::fit(ConstMatView x) const {
  const int64_t rows = spec_.calibration_tokens > 0 ? std::min(x.rows, spec_.calibration_tokens) : x.rows;
  std::vector<ChannelCodebook> books(static_cast<size_t>(x.cols));
  std::vector<float> samples(static_cast<size_t>(rows));
  for (int64_t c = 0; c < x.cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) samples[r] = x.row(r)[c];
    books[c] = make_channel_codebook(fit_kmeans_1d(samples, spec_.bits, spec_.weighted, kMaxIterations));
  }
  return books;
}

namespace {

// Rows [r0, r1) of x through the channels' codebooks into out's same rows.
void apply_codebooks(const std::vector<ChannelCodebook>& books, int bits, ConstMatView x, int64_t r0, int64_t r1,
                     MatView out) {
  const int K = 1 << bits;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < x.cols; ++c) {
      const ChannelCodebook& b = books[c];
      out.row(r)[c] = b.values[codebook_index(x.row(r)[c], b.thresholds.data(), K)];
    }
}

}  // namespace

void NuqFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  if (x.rows == 0) return;
  apply_codebooks(fit(x), spec_.bits, x, 0, x.rows, out);
}

int64_t NuqFormat::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& /*span*/,
                                  GrowthMemo* memo) const {
  if (x.rows == 0) return 0;
  // Codebooks fitted on the first N rows are the same for every span of at least N rows:
  // the new rows alone once m >= N, and the memo's codebooks once it holds them (only
  // when the caller keeps N rows or more, which a memo of other rows cannot have: the
  // cache keeps a memo only while its segment keeps its first token and format name,
  // so even a format object at a reused address would fit the same codebooks).
  const int64_t N = spec_.calibration_tokens;
  const bool settled = N >= 1 && x.rows >= N;
  std::shared_ptr<const std::vector<ChannelCodebook>> books;
  if (settled && m >= N && memo && memo->owner == this && memo->state)
    books = std::static_pointer_cast<const std::vector<ChannelCodebook>>(memo->state);
  else
    books = std::make_shared<const std::vector<ChannelCodebook>>(fit(x));
  if (settled && memo) *memo = GrowthMemo{this, books};
  const int64_t first = N >= 1 && m >= N ? std::min(m, x.rows) : 0;
  apply_codebooks(*books, spec_.bits, x, first, x.rows, out);
  return first;
}

void NuqFormat::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  if (x.rows == 0) return;
  const std::vector<ChannelCodebook> books = fit(x);
  const int K = 1 << spec_.bits;
  for (const ChannelCodebook& b : books)
    for (float v : b.values) out.put(f32_to_f16_bits(v), 16);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c)
      out.put(static_cast<uint64_t>(codebook_index(x.row(r)[c], books[c].thresholds.data(), K)), spec_.bits);
}

std::string NuqFormat::code_layout() const {
  return "per channel (ascending): 2^b fp16 codebook values (ascending); then per row, per channel: a b-bit index "
         "into that channel's codebook";
}

FormatPtr parse_nuq_format(std::string_view name) {
  NameParts parts(name);
  if (!parts.head_starts_with("nuq")) return nullptr;
  const std::string where = "format '" + std::string(name) + "'";
  const auto b = parse_int_suffix(parts.at(0), "nuq");
  if (!b || *b < 1 || *b > 8) throw ConfigError(where + ": expected nuq<b>[-cal<N>][-wsq] with b in 1..8 (e.g. nuq4-cal256)");
  NuqSpec s;
  s.bits = static_cast<int>(*b);
  size_t i = 1;
  if (auto cal = parse_int_suffix(parts.at(i), "cal")) {
    if (*cal < 1) throw ConfigError(where + ": calibration tokens must be >= 1");
    s.calibration_tokens = *cal;
    ++i;
  }
  if (parts.at(i) == "wsq") {
    s.weighted = true;
    ++i;
  }
  if (i != parts.size())
    throw ConfigError(where + ": unknown option '-" + std::string(parts.at(i)) + "' (expected -cal<N> then -wsq)");
  return std::make_shared<NuqFormat>(s);
}

}  // namespace kvb
