#include "sim/strategies/statistics.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "sim/core/error.h"

namespace kvb {

EntropyKind parse_entropy_kind(const std::string& s, const std::string& where) {
  if (s == "shannon") return EntropyKind::Shannon;
  if (s == "renyi2") return EntropyKind::Renyi2;
  throw ConfigError(where + ": entropy must be \"shannon\" or \"renyi2\", got \"" + s + "\"");
}

EntropyAverage parse_entropy_average(const std::string& s, const std::string& where) {
  if (s == "mean") return EntropyAverage::Mean;
  if (s == "effective") return EntropyAverage::Effective;
  throw ConfigError(where + ": entropy_average must be \"mean\" or \"effective\", got \"" + s + "\"");
}

GqaAggregate parse_gqa_aggregate(const std::string& s, const std::string& where) {
  if (s == "mean") return GqaAggregate::Mean;
  if (s == "min") return GqaAggregate::Min;
  if (s == "max") return GqaAggregate::Max;
  throw ConfigError(where + ": gqa must be \"mean\", \"min\" or \"max\", got \"" + s + "\"");
}

const char* entropy_kind_name(EntropyKind k) { return k == EntropyKind::Shannon ? "shannon" : "renyi2"; }

RecordingStats::RecordingStats(const Recording& rec, std::vector<int64_t> calibration)
    : rec_(rec), calibration_(std::move(calibration)) {
  std::sort(calibration_.begin(), calibration_.end());
  calibration_.erase(std::unique(calibration_.begin(), calibration_.end()), calibration_.end());
  for (int64_t t : calibration_)
    if (t < 0 || t >= rec_.tokens)
      throw Error("calibration position " + std::to_string(t) + " outside the recording's " +
                  std::to_string(rec_.tokens) + " tokens");
  // A sliding-window model's recording: only queries before its smallest window
  // attend as the model does.
  const int64_t exact = rec_.full_causal_queries();
  const auto beyond = std::lower_bound(calibration_.begin(), calibration_.end(), exact);
  outside_window_ = static_cast<int64_t>(calibration_.end() - beyond);
  calibration_.erase(beyond, calibration_.end());
}

RecordingStats::Entropies RecordingStats::head_statistics(int64_t li, int64_t h, std::vector<double>& recv) const {
  const int64_t T = rec_.tokens, d = rec_.head_dim;
  const LayerTensors& Lt = rec_.layers[static_cast<size_t>(li)];
  const float* k = Lt.key.slice(rec_.kv_head_of(h));
  std::vector<float> s(static_cast<size_t>(T));
  std::vector<double> p(static_cast<size_t>(T));
  Entropies e;
  double weight_shannon = 0, weight_renyi2 = 0;  // Σ_t 2^(−H(t))
  for (int64_t t : calibration_) {
    attention_scores(Lt.query_row(h, t), k, t + 1, d, 0, 1, s.data());
    softmax_row(s.data(), t + 1, p.data());
    const double hs = shannon_entropy_bits(p.data(), t + 1), h2 = renyi2_entropy_bits(p.data(), t + 1);
    e.mean.shannon += hs;
    e.mean.renyi2 += h2;
    weight_shannon += std::exp2(-hs);
    weight_renyi2 += std::exp2(-h2);
    for (int64_t j = 0; j <= t; ++j) recv[static_cast<size_t>(j)] += p[static_cast<size_t>(j)];
  }
  if (!calibration_.empty()) {
    const double n = static_cast<double>(calibration_.size());
    e.mean.shannon /= n;
    e.mean.renyi2 /= n;
    e.effective.shannon = -std::log2(weight_shannon / n);
    e.effective.renyi2 = -std::log2(weight_renyi2 / n);
  }
  return e;
}

std::vector<std::vector<double>> RecordingStats::received_per_kv_head(const std::vector<std::vector<double>>& recv_q,
                                                                      size_t first) const {
  const int64_t Hq = rec_.q_heads, T = rec_.tokens;
  std::vector<std::vector<double>> recv(static_cast<size_t>(rec_.kv_heads), std::vector<double>(static_cast<size_t>(T)));
  for (int64_t h = 0; h < Hq; ++h) {
    std::vector<double>& dst = recv[static_cast<size_t>(rec_.kv_head_of(h))];
    const std::vector<double>& src = recv_q[first + static_cast<size_t>(h)];
    for (int64_t j = 0; j < T; ++j) dst[static_cast<size_t>(j)] += src[static_cast<size_t>(j)];
  }
  return recv;
}

void RecordingStats::compute_attention_statistics(bool parallel) {
  const int64_t L = rec_.num_layers(), Hq = rec_.q_heads, T = rec_.tokens;
  std::vector<std::vector<Entropies>> ent(static_cast<size_t>(L), std::vector<Entropies>(static_cast<size_t>(Hq)));
  // Per query head first (so heads can run in parallel), summed per KV head after.
  std::vector<std::vector<double>> recv_q(static_cast<size_t>(L * Hq), std::vector<double>(static_cast<size_t>(T)));
  const int64_t tasks = L * Hq;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t li = task / Hq, h = task % Hq;
    ent[static_cast<size_t>(li)][static_cast<size_t>(h)] = head_statistics(li, h, recv_q[static_cast<size_t>(task)]);
  }
  std::vector<std::vector<std::vector<double>>> recv(static_cast<size_t>(L));
  for (int64_t li = 0; li < L; ++li) recv[static_cast<size_t>(li)] = received_per_kv_head(recv_q, static_cast<size_t>(li * Hq));
  entropies_ = std::move(ent);
  received_ = std::move(recv);
}

void RecordingStats::add_layer(int64_t li) {
  const int64_t L = rec_.num_layers(), Hq = rec_.q_heads, T = rec_.tokens;
  if (entropies_.empty()) {
    entropies_.assign(static_cast<size_t>(L), {});
    received_.assign(static_cast<size_t>(L), {});
    layers_added_.assign(static_cast<size_t>(L), 0);
  }
  std::vector<Entropies> ent(static_cast<size_t>(Hq));
  std::vector<std::vector<double>> recv_q(static_cast<size_t>(Hq), std::vector<double>(static_cast<size_t>(T)));
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel())
  for (int64_t h = 0; h < Hq; ++h) ent[static_cast<size_t>(h)] = head_statistics(li, h, recv_q[static_cast<size_t>(h)]);
  entropies_[static_cast<size_t>(li)] = std::move(ent);
  received_[static_cast<size_t>(li)] = received_per_kv_head(recv_q, 0);
  layers_added_[static_cast<size_t>(li)] = 1;
}

void RecordingStats::finish_layers() {
  for (size_t li = 0; li < layers_added_.size(); ++li)
    if (!layers_added_[li]) throw Error("internal: RecordingStats::finish_layers before layer " + std::to_string(li));
  if (layers_added_.size() != static_cast<size_t>(rec_.num_layers()))
    throw Error("internal: RecordingStats::finish_layers: no layer was added");
  std::call_once(attention_once_, [] {});  // what add_layer computed is the statistics
}

void RecordingStats::warm_up() {
  std::call_once(attention_once_, [&] { compute_attention_statistics(!omp_in_parallel()); });
}

void RecordingStats::require_calibration(const char* what) const {
  if (calibration_.empty() && outside_window_ > 0)
    throw Error(std::string(what) + " need calibration queries, but the model slides over the last W = " +
                std::to_string(rec_.full_causal_queries()) + " tokens and none of the " +
                std::to_string(outside_window_) + " calibration positions lies below W, where the recording's full "
                "causal attention is the model's (see the manifest's calibration rule; lower its offset, or give "
                "a strategy that reads no statistics, e.g. a fixed format)");
  if (calibration_.empty())
    throw Error(std::string(what) + " need calibration queries, but the [calibration] rule selects none of the "
                "recording's " + std::to_string(rec_.tokens) + " tokens (see the manifest's calibration rule; "
                "lower offset or stride, or use more tokens)");
}

const std::vector<std::vector<RecordingStats::Entropies>>& RecordingStats::head_entropies() {
  require_calibration("attention entropies");
  std::call_once(attention_once_, [&] { compute_attention_statistics(false); });
  return entropies_;
}

const std::vector<std::vector<std::vector<double>>>& RecordingStats::received_attention() {
  require_calibration("attention-selected sink tokens");
  std::call_once(attention_once_, [&] { compute_attention_statistics(false); });
  return received_;
}

double RecordingStats::kv_head_entropy(int64_t li, int64_t g, EntropyKind kind, GqaAggregate agg,
                                       EntropyAverage average) {
  const std::vector<Entropies>& heads = head_entropies()[static_cast<size_t>(li)];
  const int64_t G = rec_.group_size();
  double acc = agg == GqaAggregate::Mean ? 0.0 : (agg == GqaAggregate::Min ? 1e300 : -1e300);
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    const HeadEntropy& he =
        average == EntropyAverage::Mean ? heads[static_cast<size_t>(h)].mean : heads[static_cast<size_t>(h)].effective;
    const double e = kind == EntropyKind::Shannon ? he.shannon : he.renyi2;
    if (agg == GqaAggregate::Mean)
      acc += e / static_cast<double>(G);
    else if (agg == GqaAggregate::Min)
      acc = std::min(acc, e);
    else
      acc = std::max(acc, e);
  }
  return acc;
}

double RecordingStats::layer_key_rho(int64_t li, int64_t t0, int64_t t1) {
  const std::string key = "key_rho_layer:" + std::to_string(li) + ":" + std::to_string(t0) + ":" + std::to_string(t1);
  return memo<double>(key, [&] {
    if (rec_.layers[static_cast<size_t>(li)].key.empty())
      throw Error("internal: key rho of layer " + std::to_string(li) + " over tokens [" + std::to_string(t0) + ", " +
                  std::to_string(t1) + ") was not computed while the streamed layer was held (a strategy's "
                  "key_rho_ranges does not name every range its plan reads)");
    return key_rho_layer(rec_, li, t0, t1);
  });
}

double RecordingStats::key_rho(const KeyRhoRange& range) {
  std::vector<double> layer_rhos;
  for (int64_t li : key_rho_layers(rec_, range)) layer_rhos.push_back(layer_key_rho(li, range.t0, range.t1));
  return mean_of_layer_rhos(layer_rhos);
}

void RecordingStats::add_key_rho_layer(int64_t li, const std::vector<KeyRhoRange>& ranges) {
  for (const KeyRhoRange& range : ranges) {
    std::vector<int64_t> layers;
    try {
      layers = key_rho_layers(rec_, range);
    } catch (const Error&) {
      continue;  // key_rho throws the same when the plan asks for it
    }
    if (std::find(layers.begin(), layers.end(), li) != layers.end()) layer_key_rho(li, range.t0, range.t1);
  }
}

RecordingStats::Slot& RecordingStats::slot_for(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Slot>& s = slots_[key];
  if (!s) s = std::make_unique<Slot>();
  return *s;
}

}  // namespace kvb
