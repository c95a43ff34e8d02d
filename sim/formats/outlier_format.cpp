#include "sim/formats/outlier_format.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/name_parse.h"
#include "sim/formats/registry.h"

namespace kvb {

int64_t OutlierFormat::outliers_per_vector(int64_t head_dim) const {
  return static_cast<int64_t>(std::floor(static_cast<double>(percent_) * static_cast<double>(head_dim) / 100.0 + 0.5));
}

std::string OutlierFormat::name() const { return "outliers" + name_number(percent_) + "%:" + inner_->name(); }

uint64_t OutlierFormat::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  return inner_->storage_bits(tokens, head_dim) +
         static_cast<uint64_t>(tokens) * static_cast<uint64_t>(outliers_per_vector(head_dim)) * 32u;
}

std::string OutlierFormat::check_shape(int64_t tokens, int64_t head_dim) const {
  if (head_dim > 65536) return "16-bit outlier indices cannot address head_dim " + std::to_string(head_dim);
  return inner_->check_shape(tokens, head_dim);
}

void OutlierFormat::split(ConstMatView x, std::vector<int32_t>& idx, std::vector<float>& dense) const {
  const int64_t d = x.cols, k = outliers_per_vector(d);
  idx.resize(static_cast<size_t>(x.rows * k));
  dense.resize(static_cast<size_t>(x.rows * d));
  std::vector<int32_t> order(static_cast<size_t>(d));
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float* dr = dense.data() + r * d;
    std::copy(xr, xr + d, dr);
    if (k == 0) continue;
    std::iota(order.begin(), order.end(), 0);
    auto larger = [xr](int32_t a, int32_t b) {
      const float fa = std::fabs(xr[a]), fb = std::fabs(xr[b]);
      return fa > fb || (fa == fb && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), larger);
    std::sort(order.begin(), order.begin() + k);
    for (int64_t i = 0; i < k; ++i) {
      idx[r * k + i] = order[i];
      dr[order[i]] = 0.0f;
    }
  }
}

void OutlierFormat::restore_outliers(ConstMatView x, const std::vector<int32_t>& idx, int64_t r0, int64_t r1,
                                     MatView out) const {
  const int64_t k = outliers_per_vector(x.cols);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t c = idx[r * k + i];
      out.row(r)[c] = round_to_f16(x.row(r)[c]);
    }
}

void OutlierFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const {
  const int64_t d = x.cols;
  std::vector<int32_t> idx;
  std::vector<float> dense;
  split(x, idx, dense);
  inner_->roundtrip(ConstMatView{dense.data(), x.rows, d, d}, out, span);
  restore_outliers(x, idx, 0, x.rows, out);
}

int64_t OutlierFormat::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                                      GrowthMemo* memo) const {
  const int64_t d = x.cols;
  std::vector<int32_t> idx;
  std::vector<float> dense;
  split(x, idx, dense);  // per row: the first m rows' dense part is what it was
  const int64_t first = inner_->roundtrip_grown(ConstMatView{dense.data(), x.rows, d, d}, m, out, span, memo);
  restore_outliers(x, idx, first, x.rows, out);
  return first;
}

void OutlierFormat::encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const {
  const int64_t d = x.cols, k = outliers_per_vector(d);
  std::vector<int32_t> idx;
  std::vector<float> dense;
  split(x, idx, dense);
  inner_->encode(ConstMatView{dense.data(), x.rows, d, d}, span, out);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t c = idx[r * k + i];
      out.put(f32_to_f16_bits(x.row(r)[c]), 16);
      out.put(static_cast<uint64_t>(c), 16);
    }
}

std::string OutlierFormat::code_layout() const {
  return "the inner format's encoding of the dense part (" + inner_->name() + ": " + inner_->code_layout() +
         "); then per row, per outlier in ascending channel order: fp16 value, 16-bit channel index";
}

FormatPtr parse_outlier_format(std::string_view name) {
  if (name.substr(0, 8) != "outliers") return nullptr;
  const std::string where = "format '" + std::string(name) + "'";
  const size_t colon = name.find(':');
  const size_t pct = name.find('%');
  if (colon == std::string_view::npos || pct == std::string_view::npos || pct + 1 != colon)
    throw ConfigError(where + ": expected outliers<p>%:<format>, e.g. outliers1%:nuq4-cal256");
  const auto p = parse_name_number(name.substr(8, pct - 8));
  if (!p || !(*p > 0.0f) || !(*p < 100.0f))
    throw ConfigError(where + ": outlier percentage must be a decimal in (0, 100), e.g. outliers1%");
  FormatPtr inner = make_format(name.substr(colon + 1));
  if (inner->keys_only())
    throw ConfigError(where + ": " + inner->name() + " has no decoded keys to add outliers to");
  if (inner->reads_pre_rope_keys())
    throw ConfigError(where + ": " + inner->name() +
                      " quantizes the pre-RoPE keys, not the outliers' residual; put prerope: outermost, e.g. "
                      "prerope:" + std::string(name.substr(0, colon + 1)) + inner->name().substr(8));
  return std::make_shared<OutlierFormat>(*p, std::move(inner));
}

}  // namespace kvb
