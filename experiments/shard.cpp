#include "experiments/shard.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

namespace {

// FNV-1a, 64 bit: byte-wise for text, word-wise (8 bytes a step) for bulk data.
constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

void fnv_bytes(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
}

void fnv_words(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kFnvPrime;
  }
  fnv_bytes(h, p + i, n - i);
}

void fnv_int(uint64_t& h, int64_t v) { fnv_bytes(h, &v, sizeof v); }

std::string hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

size_t parse_count(const std::string& text, const std::string& what, const std::string& option) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < 0)
    throw ConfigError(option + " '" + text + "': " + what + " is not a non-negative integer");
  return static_cast<size_t>(v);
}

}  // namespace

Shard parse_shard(const std::string& text, const std::string& option,
                  const std::function<const char*(const char*)>& env_in) {
  const auto env = env_in ? env_in : [](const char* name) -> const char* { return std::getenv(name); };
  Shard s;
  if (text == "auto") {
    const char* id = env("SLURM_ARRAY_TASK_ID");
    const char* count = env("SLURM_ARRAY_TASK_COUNT");
    const char* min = env("SLURM_ARRAY_TASK_MIN");
    if (!id || !count || !min)
      throw ConfigError(option +
                        " auto: not inside a Slurm job array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT and "
                        "SLURM_ARRAY_TASK_MIN are not all set; submit with sbatch --array=0-N, or give --shard I/N)");
    const std::string where = option + " auto";
    const size_t task = parse_count(id, "SLURM_ARRAY_TASK_ID", where);
    const size_t first = parse_count(min, "SLURM_ARRAY_TASK_MIN", where);
    s.count = parse_count(count, "SLURM_ARRAY_TASK_COUNT", where);
    if (s.count == 0) throw ConfigError(where + ": SLURM_ARRAY_TASK_COUNT is 0");
    if (const char* max = env("SLURM_ARRAY_TASK_MAX")) {
      // --array=0-7:2 or 1,4,9: task ids are not MIN..MIN+COUNT-1, so ID-MIN is no shard index.
      const size_t last = parse_count(max, "SLURM_ARRAY_TASK_MAX", where);
      if (last + 1 != first + s.count)
        throw ConfigError(where + ": the job array's task ids are not consecutive (SLURM_ARRAY_TASK_MIN " +
                          std::string(min) + ", SLURM_ARRAY_TASK_MAX " + max + ", SLURM_ARRAY_TASK_COUNT " + count +
                          "); submit with --array=MIN-MAX without a step or a list");
    }
    if (task < first || task - first >= s.count)
      throw ConfigError(where + ": SLURM_ARRAY_TASK_ID " + std::string(id) + " is outside the array (MIN " + min +
                        ", COUNT " + count + ")");
    s.index = task - first;
    return s;
  }
  const size_t slash = text.find('/');
  if (slash == std::string::npos)
    throw ConfigError(option + " '" + text + "': expected I/N (shard I of N, 0 <= I < N, e.g. 0/4) or auto");
  s.index = parse_count(text.substr(0, slash), "the shard index I", option);
  s.count = parse_count(text.substr(slash + 1), "the shard count N", option);
  if (s.count == 0) throw ConfigError(option + " '" + text + "': the shard count N must be at least 1");
  if (s.index >= s.count)
    throw ConfigError(option + " '" + text + "': the shard index must be below the count (shards are numbered 0.." +
                      std::to_string(s.count - 1) + ")");
  return s;
}

double point_cost(const ExperimentSpec& spec, const SweepPoint& point) {
  bool need_sim = false, need_model = false;
  for (const std::string& m : spec.metrics.report) {
    const MetricDef* def = find_metric(m);
    if (def && def->level == MetricLevel::Model)
      need_model = true;
    else
      need_sim = true;
  }
  const bool attributed = spec.attribution.selects(point.id);
  double cost = 0.05;
  if (need_sim || attributed) cost += 1;
  if (attributed && spec.attribution.regions) cost += 2;
  if (need_model) cost += 3;
  if (point.type == "optimal") cost += 2;
  return cost;
}

std::vector<SweepPoint> shard_points(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                     const Shard& shard) {
  if (shard.whole()) return points;
  std::vector<double> cost(points.size());
  for (size_t i = 0; i < points.size(); ++i) cost[i] = point_cost(spec, points[i]);
  std::vector<size_t> order(points.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(shard.count, 0.0);
  std::vector<char> mine(points.size(), 0);
  for (size_t i : order) {
    const size_t to = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[to] += cost[i];
    mine[i] = to == shard.index;
  }
  std::vector<SweepPoint> out;
  for (size_t i = 0; i < points.size(); ++i)
    if (mine[i]) out.push_back(points[i]);
  return out;
}

namespace {

// A resolved config's table without the keys that do not change results (threads,
// output.dir, output.plots, data.stream_layers: a streamed run's results equal the held
// run's bit for bit): what sweep_config_hash hashes.
toml::table hashed_config(const std::string& resolved_toml) {
  toml::table root = toml::parse(std::string_view(resolved_toml));
  root.erase("threads");
  if (toml::table* data = root["data"].as_table()) data->erase("stream_layers");
  if (toml::table* output = root["output"].as_table()) {
    output->erase("dir");
    output->erase("plots");
    if (output->empty()) root.erase("output");  // as if it had never been given
  }
  return root;
}

// A node as TOML text on one line ("[2, 3]", "'int4'"); "absent" for none.
std::string node_text(const toml::node* n) {
  if (!n) return "absent";
  std::ostringstream os;
  n->visit([&](const auto& v) { os << toml::toml_formatter(v, toml::format_flags::none); });
  std::string text = os.str();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// node_text shortened past 60 characters, for a message.
std::string shown(const std::string& text) { return text.size() > 60 ? text.substr(0, 57) + "..." : text; }

void collect_differences(const toml::node* then, const toml::node* now, const std::string& key,
                         std::vector<std::string>& out) {
  if (then && now && then->is_table() && now->is_table()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : *then->as_table()) keys.emplace_back(k.str());
    for (const auto& [k, v] : *now->as_table())
      if (!then->as_table()->contains(k.str())) keys.emplace_back(k.str());
    for (const std::string& k : keys)
      collect_differences(then->as_table()->get(k), now->as_table()->get(k), key.empty() ? k : key + "." + k, out);
    return;
  }
  if (then && now && then->is_array() && now->is_array() && then->as_array()->size() == now->as_array()->size()) {
    for (size_t i = 0; i < then->as_array()->size(); ++i)
      collect_differences(then->as_array()->get(i), now->as_array()->get(i), key + "[" + std::to_string(i) + "]", out);
    return;
  }
  const std::string a = node_text(then), b = node_text(now);
  if (a != b) out.push_back(key + " (" + shown(a) + " there, " + shown(b) + " now)");
}

}  // namespace

std::vector<std::string> config_differences(const std::string& then_toml, const std::string& now_toml) {
  std::vector<std::string> out;
  try {
    const toml::table then = hashed_config(then_toml), now = hashed_config(now_toml);
    collect_differences(&then, &now, "", out);
  } catch (const toml::parse_error&) {
    return {};  // a hand-edited config.toml: the hashes still tell that they differ
  }
  return out;
}

std::string config_differences_text(const std::string& then_toml, const std::string& now_toml) {
  const std::vector<std::string> keys = config_differences(then_toml, now_toml);
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(keys.begin(), keys.begin() + static_cast<long>(std::min(keys.size(), kShown)));
  if (keys.size() > kShown) shown.push_back("and " + std::to_string(keys.size() - kShown) + " more");
  return join(shown, "; ");
}

std::string folder_config_differences(const std::filesystem::path& dir, const std::string& now_toml) {
  std::ifstream in(dir / "config.toml");
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return config_differences_text(text.str(), now_toml);
}

std::string sweep_config_hash(const ExperimentSpec& spec) {
  const toml::table root = hashed_config(spec.resolved_toml);
  std::ostringstream os;
  os << toml::toml_formatter(root);
  uint64_t h = kFnvOffset;
  const std::string text = os.str();
  fnv_bytes(h, text.data(), text.size());
  return hex(h);
}

RecordingIdentity::RecordingIdentity(const Recording& rec) : h_(kFnvOffset) {
  for (int64_t v : {rec.q_heads, rec.kv_heads, rec.head_dim, rec.tokens, rec.num_layers()}) fnv_int(h_, v);
  for (int id : rec.layer_ids) fnv_int(h_, id);
}

void RecordingIdentity::add_layer(const LayerTensors& l) {
  for (const Tensor* t : {&l.query, &l.key, &l.value, &l.key_pre_rope, &l.attn_output}) {
    fnv_int(h_, static_cast<int64_t>(t->shape.size()));
    for (int64_t d : t->shape) fnv_int(h_, d);
    fnv_words(h_, t->data.data(), t->data.size() * sizeof(float));
  }
  // Sampled queries: which positions they are (nothing is added for every position).
  if (l.sparse_queries()) fnv_words(h_, l.query_positions.data(), l.query_positions.size() * sizeof(int64_t));
}

std::string RecordingIdentity::finish(const Recording& rec) const {
  uint64_t h = h_;
  fnv_words(h, rec.token_ids.data(), rec.token_ids.size() * sizeof(int64_t));
  fnv_int(h, -1);
  fnv_words(h, rec.positions.data(), rec.positions.size() * sizeof(int64_t));
  fnv_int(h, rec.phase_boundary.value_or(-1));
  fnv_int(h, rec.rope.applied ? 1 : 0);
  fnv_bytes(h, &rec.rope.theta, sizeof rec.rope.theta);
  fnv_words(h, rec.rope.inv_freq.data(), rec.rope.inv_freq.size() * sizeof(float));
  return hex(h);
}

std::string recording_identity(const Recording& rec) {
  RecordingIdentity id(rec);
  for (const LayerTensors& l : rec.layers) id.add_layer(l);
  return id.finish(rec);
}

}  // namespace kvb
