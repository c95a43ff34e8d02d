// RecordingStats: statistics of a recording that strategies read (attention entropy
// per head, attention received per token, key redundancy ρ, measured distortion tables),
// computed once per run on the calibration query positions and shared by every sweep
// point. Thread-safe: each entry is filled lazily, once, by the first thread that
// asks; every entry is a pure function of the recording and the calibration
// positions, so results do not depend on which thread computed them.
#pragma once
#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sim/metrics/attention.h"
#include "sim/metrics/redundancy.h"
#include "sim/recording.h"

namespace kvb {

enum class EntropyKind { Shannon, Renyi2 };
// How per-query entropies H(t) average over the calibration queries:
//   Mean:      the arithmetic mean of H(t) (the research);
//   Effective: −log₂ of the mean of 2^(−H(t)). For Rényi-2, 2^(−H₂(t)) = Σ_j p_tj² is
//              the weight of the query's first-order value error (methods.md §5), so
//              this is the entropy under which α = 0.5 is the optimum of that model.
enum class EntropyAverage { Mean, Effective };
// How the entropies of a KV head's query heads (GQA) combine into the KV head's.
enum class GqaAggregate { Mean, Min, Max };

// Parse "shannon" / "renyi2" and "mean" / "min" / "max"; throw kvb::ConfigError naming `where`.
EntropyKind parse_entropy_kind(const std::string& s, const std::string& where);
EntropyAverage parse_entropy_average(const std::string& s, const std::string& where);
GqaAggregate parse_gqa_aggregate(const std::string& s, const std::string& where);
const char* entropy_kind_name(EntropyKind k);

class RecordingStats {
 public:
  // `calibration`: query positions (each < rec.tokens, sorted, distinct) the
  // statistics are measured on; never the evaluated ones unless a config says so.
  // For a recording with sliding windows, those at or beyond
  // rec.full_causal_queries() (the smallest window W) are left out: the statistics'
  // full causal attention is the model's only for queries t < W.
  RecordingStats(const Recording& rec, std::vector<int64_t> calibration);

  const Recording& recording() const { return rec_; }
  const std::vector<int64_t>& calibration() const { return calibration_; }
  // Throws kvb::Error, saying that `what` needs calibration queries and why there are
  // none (a sliding window named), when there are none.
  void require_calibration(const char* what) const;
  // Calibration positions left out because they lie beyond a sliding window.
  int64_t calibration_outside_window() const { return outside_window_; }

  // Attention entropy (bits) of one query head over the calibration positions,
  // causal prefix only, averaged both ways.
  struct Entropies {
    HeadEntropy mean;       // arithmetic means of H(t)
    HeadEntropy effective;  // −log₂ mean 2^(−H(t))
  };
  // [layers][q_heads]. Throws kvb::Error without calibration positions (as do
  // kv_head_entropy and received_attention): statistics of no query are no data.
  const std::vector<std::vector<Entropies>>& head_entropies();
  // Entropy of KV head g of layer li: its query heads' entropies combined by `agg`.
  double kv_head_entropy(int64_t li, int64_t g, EntropyKind kind, GqaAggregate agg,
                         EntropyAverage average = EntropyAverage::Mean);
  // Attention each token receives, summed over the calibration queries and over the
  // query heads of each KV head: [layers][kv_heads][T].
  const std::vector<std::vector<std::vector<double>>>& received_attention();

  // Computes head entropies and received attention now, in parallel over heads (call
  // outside a parallel region; later calls are free).
  void warm_up();
  // warm_up() layer by layer, for a recording whose layers are streamed
  // (sim/layer_stream.h): add_layer(li) while layer li is held (in parallel over its
  // query heads), for every layer, then finish_layers(). The same values as warm_up's,
  // bit for bit. finish_layers throws kvb::Error when a layer was not added.
  void add_layer(int64_t li);
  void finish_layers();

  // Key redundancy ρ of `range` (key_rho, sim/metrics/redundancy.h; post-RoPE keys
  // when the recording has RoPE), bit for bit: mean_of_layer_rhos of per-layer values
  // memoized here, each computed on first use from its layer's keys, or beforehand by
  // add_key_rho_layer (a streamed recording). Throws key_rho's kvb::Error for a bad
  // range or layer, and kvb::Error for a layer whose keys are not held and whose value
  // was not added.
  double key_rho(const KeyRhoRange& range);
  // For a streamed recording, while layer li is held: computes li's value for each of
  // `ranges` that averages over it, for key_rho to find when the layer is gone. A range
  // key_rho would refuse (bad tokens or layers) is skipped: key_rho throws for it later.
  void add_key_rho_layer(int64_t li, const std::vector<KeyRhoRange>& ranges);

  // The value stored under `key`, computed by `compute` on first use. T must be
  // copyable; a throwing compute leaves the entry empty for the next caller.
  template <typename T>
  const T& memo(const std::string& key, const std::function<T()>& compute) {
    Slot& slot = slot_for(key);
    // A mutex, not std::call_once: an exception leaving call_once hangs later callers
    // with some C++ libraries (libstdc++ on non-x86 targets).
    const std::lock_guard<std::mutex> lock(slot.mutex);
    if (!slot.value.has_value()) slot.value = compute();
    return std::any_cast<const T&>(slot.value);
  }

 private:
  struct Slot {
    std::mutex mutex;  // held while the value is computed
    std::any value;    // empty until computed
  };
  Slot& slot_for(const std::string& key);
  void compute_attention_statistics(bool parallel);
  // key_rho_layer of layer li over [t0, t1), memoized (key_rho, add_key_rho_layer).
  double layer_key_rho(int64_t li, int64_t t0, int64_t t1);
  // One query head's entropies over the calibration positions (layer li held); adds the
  // attention each token receives to recv [T].
  Entropies head_statistics(int64_t li, int64_t h, std::vector<double>& recv) const;
  // [kv_heads][T]: recv_q[first + h] summed over each KV head's query heads, in order.
  std::vector<std::vector<double>> received_per_kv_head(const std::vector<std::vector<double>>& recv_q,
                                                        size_t first) const;

  const Recording& rec_;
  std::vector<int64_t> calibration_;
  int64_t outside_window_ = 0;
  std::once_flag attention_once_;
  std::vector<std::vector<Entropies>> entropies_;
  std::vector<std::vector<std::vector<double>>> received_;
  std::vector<char> layers_added_;  // [layers]: add_layer ran (streamed layers)
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Slot>> slots_;
};

}  // namespace kvb
