// `kvbudget inspect FILE`: what a tensor file holds (tensors, statistics, metadata)
// and, when it holds a recording, the attention entropy of every layer and query head.
#include <fnmatch.h>
#include <omp.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <cstring>
#include <limits>
#include <regex>
#include <set>

#include "experiments/cli/commands.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/tensor_store.h"
#include "sim/metrics/attention.h"
#include "sim/recording.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace kvb::cli {

namespace {

// Statistics of one tensor over its finite elements; NaN and Inf are only counted.
struct TensorStats {
  int64_t finite = 0, nan = 0, inf = 0;
  double min = 0, max = 0, mean = 0, stddev = 0, absmax = 0;
};

TensorStats tensor_stats(const Tensor& t) {
  TensorStats s;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0, sum_sq = 0;
  for (const float f : t.data) {
    if (std::isnan(f)) {
      ++s.nan;
      continue;
    }
    if (std::isinf(f)) {
      ++s.inf;
      continue;
    }
    const double v = f;
    ++s.finite;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  if (s.finite == 0) return s;
  s.min = lo;
  s.max = hi;
  s.mean = sum / static_cast<double>(s.finite);
  for (const float f : t.data)  // two passes: no cancellation in the variance
    if (std::isfinite(f)) sum_sq += (f - s.mean) * (f - s.mean);
  s.stddev = std::sqrt(sum_sq / static_cast<double>(s.finite));
  s.absmax = std::max(std::fabs(lo), std::fabs(hi));
  return s;
}

// A tensor name pattern ("layers.{layer}.key") as a regular expression matching its instances.
std::string pattern_regex(const std::string& pattern) {
  std::string re;
  const std::vector<std::string> parts = split(replace_all(pattern, "layer", "\x01"), '\x01');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) re += "[0-9]+";
    for (const char c : parts[i]) {
      if (c != '\0' && std::strchr(".^$|()[]{}*+?\\", c)) re += '\\';
      re += c;
    }
  }
  return re;
}

std::string human_bytes(uintmax_t n) {
  char buf[32];
  if (n < 1024) std::snprintf(buf, sizeof buf, "%ju B", n);
  else if (n < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  else if (n < (1u << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  return buf;
}

// With `json`, each function fills its part of the --json object instead of printing.
using Json = nlohmann::ordered_json;

void print_metadata(const TensorStore& store, Json* json) {
  const auto md = store.metadata();
  if (json) {
    (*json)["metadata"] = Json::object();
    for (const auto& [k, v] : md) (*json)["metadata"][k] = v;
    return;
  }
  if (md.empty()) return;
  size_t w = 0;
  for (const auto& kv : md) w = std::max(w, kv.first.size());
  std::printf("\nmetadata:\n");
  for (const auto& [k, v] : md) std::printf("  %-*s  %s\n", static_cast<int>(w), k.c_str(), v.c_str());
}

void print_tensors(const TensorStore& store, const std::vector<TensorInfo>& tensors, bool stats, bool show_file,
                   Json* json) {
  if (json) {
    const auto number = [](double v, bool any) { return any ? Json(v) : Json(); };
    Json list = Json::array();
    for (const TensorInfo& t : tensors) {
      Json jt = {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                 {"file", fs::path(t.file).filename().string()}, {"stats", nullptr}};
      if (stats) {
        const TensorStats s = tensor_stats(store.read_f32(t.name));
        const bool any = s.finite > 0;  // no finite element: no min, max, ...
        jt["stats"] = {{"min", number(s.min, any)},   {"max", number(s.max, any)},       {"mean", number(s.mean, any)},
                       {"std", number(s.stddev, any)}, {"absmax", number(s.absmax, any)}, {"nan", s.nan},
                       {"inf", s.inf}};
      }
      list.push_back(jt);
    }
    (*json)["tensors"] = list;
    return;
  }
  size_t name_w = 4, shape_w = 5, file_w = 4;
  for (const TensorInfo& t : tensors) {
    name_w = std::max(name_w, t.name.size());
    shape_w = std::max(shape_w, shape_str(t.shape).size());
    file_w = std::max(file_w, fs::path(t.file).filename().string().size());
  }
  const int nw = static_cast<int>(name_w), sw = static_cast<int>(shape_w), fw = static_cast<int>(file_w);
  std::printf("\n%-*s  %-5s  %-*s", nw, "name", "dtype", sw, "shape");
  if (show_file) std::printf("  %-*s", fw, "file");
  if (stats) std::printf("  %10s %10s %10s %10s %10s %6s %6s", "min", "max", "mean", "std", "absmax", "nan", "inf");
  std::printf("\n");
  for (const TensorInfo& t : tensors) {
    std::printf("%-*s  %-5s  %-*s", nw, t.name.c_str(), dtype_name(t.dtype), sw, shape_str(t.shape).c_str());
    if (show_file) std::printf("  %-*s", fw, fs::path(t.file).filename().string().c_str());
    if (stats) {
      const TensorStats s = tensor_stats(store.read_f32(t.name));
      if (s.finite > 0)
        std::printf("  %10.4g %10.4g %10.4g %10.4g %10.4g", s.min, s.max, s.mean, s.stddev, s.absmax);
      else
        std::printf("  %10s %10s %10s %10s %10s", "-", "-", "-", "-", "-");
      std::printf(" %6lld %6lld", static_cast<long long>(s.nan), static_cast<long long>(s.inf));
    }
    std::printf("\n");
  }
}

// One table (layers x query heads) of mean entropies in bits, with per-layer means.
void print_entropy_table(const Recording& rec, const std::vector<HeadEntropy>& h, bool renyi) {
  std::printf("  %-8s", renyi ? "H2" : "H");
  for (int64_t q = 0; q < rec.q_heads; ++q) std::printf(" %6s", ("h" + std::to_string(q)).c_str());
  std::printf("   %6s\n", "mean");
  for (int64_t li = 0; li < rec.num_layers(); ++li) {
    std::printf("  layer %-2d", rec.layer_ids[static_cast<size_t>(li)]);
    double sum = 0;
    for (int64_t q = 0; q < rec.q_heads; ++q) {
      const HeadEntropy& e = h[static_cast<size_t>(li * rec.q_heads + q)];
      const double v = renyi ? e.renyi2 : e.shannon;
      sum += v;
      std::printf(" %6.3f", v);
    }
    std::printf("   %6.3f\n", sum / static_cast<double>(rec.q_heads));
  }
}

// Relative L2 of a layer's recomputed attention output against the recorded one above
// which --check-output fails: fp16/bf16 storage gives about 1e-3; a wrong layout, a
// missing RoPE or the output of another layer give O(1).
constexpr double kOutputMismatch = 0.05;

// Prints the recording's summary and entropy tables and, with check_output, compares
// the recorded attn_output with attention recomputed from q/k/v. Returns the number
// of layers whose relative L2 exceeds kOutputMismatch.
int64_t print_recording(const Recording& rec, int64_t max_positions, bool check_output, Json* json) {
  if (!json) {
    std::printf("\nrecording %s: %s\n", rec.name.c_str(), rec.summary().c_str());
    if (!rec.token_ids.empty()) std::printf("  token ids: %zu\n", rec.token_ids.size());
  }
  const std::vector<int64_t> positions = spread_positions(rec.tokens, max_positions);
  const int64_t L = rec.num_layers(), H = rec.q_heads;
  std::vector<HeadEntropy> entropy(static_cast<size_t>(L * H));
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < L * H; ++i) entropy[static_cast<size_t>(i)] = head_entropy(rec, i / H, i % H, positions);
  Json* jrec = nullptr;
  if (json) {
    Json heads = Json::array();
    for (int64_t i = 0; i < L * H; ++i)
      heads.push_back({{"layer", rec.layer_ids[static_cast<size_t>(i / H)]},
                       {"head", i % H},
                       {"shannon_bits", entropy[static_cast<size_t>(i)].shannon},
                       {"renyi2_bits", entropy[static_cast<size_t>(i)].renyi2}});
    (*json)["recording"] = {{"name", rec.name},
                            {"summary", rec.summary()},
                            {"tokens", rec.tokens},
                            {"q_heads", rec.q_heads},
                            {"kv_heads", rec.kv_heads},
                            {"head_dim", rec.head_dim},
                            {"layers", rec.layer_ids},
                            {"token_ids", rec.token_ids.size()},
                            {"entropy_positions", positions.size()},
                            {"entropy", positions.empty() ? Json(nullptr) : heads},  // null: no position to average
                            {"output_check", nullptr}};
    jrec = &(*json)["recording"];
  }
  if (!json && positions.empty())  // one token: its query attends to itself alone (H = 0 by definition, not measured)
    std::printf("\nattention entropy: not defined, the recording has %lld token(s) and no query position attends to "
                "more than one key\n",
                static_cast<long long>(rec.tokens));
  else if (!json)
    std::printf("\nattention entropy, bits (mean over %zu query positions in [1, %lld]; GQA group %lld):\n",
                positions.size(), static_cast<long long>(rec.tokens - 1), static_cast<long long>(rec.group_size()));
  if (!json && !positions.empty()) {
    std::printf(" Shannon H = -sum p log2 p\n");
    print_entropy_table(rec, entropy, false);
    std::printf(" Renyi-2 H2 = -log2 sum p^2\n");
    print_entropy_table(rec, entropy, true);
  }

  if (!check_output) return 0;
  if (!rec.has_attn_output())  // nothing checked is not a pass
    throw Error("--check-output: the recording has no attn_output tensors to compare (see --attn-output-layout and "
                "the attn_output pattern layers.{layer}.attn_output)");
  int64_t mismatched = 0;
  // Recompute softmax(q kᵀ/√d)·v for every head and compare with the recorded output.
  if (jrec) (*jrec)["output_check"] = Json::array();
  else std::printf("\nattn_output check (recomputed from query/key/value vs recorded; relative L2 / max abs):\n");
  const int64_t T = rec.tokens, d = rec.head_dim;
  for (int64_t li = 0; li < L; ++li) {
    const LayerTensors& lt = rec.layers[static_cast<size_t>(li)];
    std::vector<double> err(static_cast<size_t>(H)), ref(static_cast<size_t>(H)), maxabs(static_cast<size_t>(H));
#pragma omp parallel for schedule(dynamic)
    for (int64_t q = 0; q < H; ++q) {
      std::vector<float> o(static_cast<size_t>(T * d));
      const int64_t g = rec.kv_head_of(q);
      attention_output(lt.query.slice(q), lt.key.slice(g), lt.value.slice(g), T, d, 0, T, o.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < d; ++c) {
          const double r = lt.attn_output.data[static_cast<size_t>(t * H * d + q * d + c)];
          const double diff = o[static_cast<size_t>(t * d + c)] - r;
          err[static_cast<size_t>(q)] += diff * diff;
          ref[static_cast<size_t>(q)] += r * r;
          maxabs[static_cast<size_t>(q)] = std::max(maxabs[static_cast<size_t>(q)], std::fabs(diff));
        }
    }
    double e = 0, r = 0, m = 0;
    for (int64_t q = 0; q < H; ++q) {
      e += err[static_cast<size_t>(q)];
      r += ref[static_cast<size_t>(q)];
      m = std::max(m, maxabs[static_cast<size_t>(q)]);
    }
    const double rel = e == 0 ? 0.0 : std::sqrt(e / r);  // both all zero: a match
    const bool bad = !(rel <= kOutputMismatch);
    mismatched += bad;
    if (jrec)
      (*jrec)["output_check"].push_back({{"layer", rec.layer_ids[static_cast<size_t>(li)]},
                                         {"relative_l2", rel},
                                         {"max_abs", m},
                                         {"mismatch", bad}});
    else
      std::printf("  layer %-2d  %.3e  %.3e%s\n", rec.layer_ids[static_cast<size_t>(li)], rel, m,
                  bad ? "  MISMATCH" : "");
  }
  return mismatched;
}

// "0,5" -> {0, 5}: the --layers option's layer indices.
std::vector<int> parse_layer_list(const std::string& text) {
  std::vector<int> layers;
  for (const std::string& part : split(text, ',')) {
    int v = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v < 0)
      throw ConfigError("--layers " + text + ": '" + part + "' is not a layer index (give e.g. --layers 0,5)");
    layers.push_back(v);
  }
  return layers;
}

}  // namespace

int cmd_inspect(const Args& args) {
  po::options_description opts("kvbudget inspect FILE [options]");
  std::string file, tensors_glob, layers_text;
  RecordingSpec spec;
  int64_t positions = 256;
  opts.add_options()("help,h", "show this help")(
      "tensors", po::value(&tensors_glob), "list only tensors whose name matches this glob, e.g. 'layers.0.*'")(
      "no-stats", "skip the per-tensor statistics (faster on large checkpoints)")(
      "no-recording", "skip the recording and its attention entropy")(
      "query", po::value(&spec.query), "query tensor pattern (default layers.{layer}.query)")(
      "key", po::value(&spec.key), "key tensor pattern (default layers.{layer}.key)")(
      "value", po::value(&spec.value), "value tensor pattern (default layers.{layer}.value)")(
      "layout", po::value(&spec.layout), "q/k/v axis order from {batch,heads,tokens,head_dim} (default heads,tokens,head_dim)")(
      "attn-output-layout", po::value(&spec.attn_output_layout), "attn_output axis order (default tokens,hidden)")(
      "max-tokens", po::value(&spec.max_tokens), "keep the first N tokens of the recording")(
      "layers", po::value(&layers_text),
      "read only these layers as the recording, e.g. 0,5 (needed for a file holding some layers, such as "
      "data/reference/*-record-slice.safetensors)")(
      "positions", po::value(&positions), "at most N query positions per head for the entropy (default 256)")(
      "check-output", "recompute attention from q/k/v and compare with the recorded attn_output")(
      "json", "print everything as one JSON object (README \"Command line conventions\")");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "file", po::value(&file), 1, "inspect", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nFILE: .safetensors, a Hugging Face sharded checkpoint (its directory or\n"
                 "model.safetensors.index.json), .npy, .npz, or a directory of .npy files.\n";
    return kExitOk;
  }
  if (file.empty()) {
    std::cerr << "kvbudget inspect: missing FILE (e.g. kvbudget inspect data/records/gpt2-bytes-record.safetensors)\n\n"
              << opts;
    return kExitUsage;
  }
  if (positions <= 0) throw ConfigError("--positions must be positive");
  if (vm.count("max-tokens") && spec.max_tokens < 1)
    throw ConfigError("--max-tokens must be >= 1, got " + std::to_string(spec.max_tokens));
  if (vm.count("no-recording") && vm.count("check-output"))
    throw ConfigError("--check-output compares the recording's attn_output; it cannot go with --no-recording");

  const std::unique_ptr<TensorStore> store = TensorStore::open(file);
  std::vector<TensorInfo> tensors = store->list();
  std::set<std::string> files;
  for (const TensorInfo& t : tensors) files.insert(t.file);
  std::string size;
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) size = ", " + human_bytes(fs::file_size(file, ec));
  Json json_doc;
  Json* json = vm.count("json") ? &json_doc : nullptr;
  // The JSON goes out on every return after this point, errors included (then on
  // stdout before the error on stderr): what was found is not lost.
  struct PrintAtExit {
    Json* json;
    ~PrintAtExit() {
      if (json) std::printf("%s\n", json->dump(2).c_str());
    }
  } print_at_exit{json};
  if (json) {
    json_doc = {{"file", file}, {"files", files.size()}, {"tensor_count", tensors.size()},
                {"bytes", fs::is_regular_file(file, ec) ? Json(fs::file_size(file, ec)) : Json()}};
  } else {
    std::printf("%s: %zu tensors in %zu file%s%s\n", file.c_str(), tensors.size(), files.size(),
                files.size() == 1 ? "" : "s", size.c_str());
  }
  print_metadata(*store, json);
  if (!tensors_glob.empty()) {
    const size_t all = tensors.size();
    std::erase_if(tensors, [&](const TensorInfo& t) { return fnmatch(tensors_glob.c_str(), t.name.c_str(), 0) != 0; });
    if (tensors.empty())
      throw ConfigError("--tensors '" + tensors_glob + "' matches none of the " + std::to_string(all) +
                        " tensors of " + file);
  }
  print_tensors(*store, tensors, !vm.count("no-stats"), files.size() > 1, json);
  std::fflush(stdout);
  if (json) json_doc["recording"] = nullptr;

  if (vm.count("no-recording")) return kExitOk;
  const bool explicit_recording = vm.count("query") || vm.count("key") || vm.count("value") || vm.count("layout");
  if (!explicit_recording) {
    // Only files with a tensor named like a key ("layers.3.key") are read as recordings.
    const std::regex key_name(pattern_regex(spec.key));
    bool any_key = false;
    for (const TensorInfo& t : store->list()) any_key = any_key || std::regex_match(t.name, key_name);
    if (!any_key) {
      if (!json) std::printf("\nrecording: none (no tensor matches '%s'; name the tensors with --query/--key/--value)\n",
                  spec.key.c_str());
      if (vm.count("check-output"))
        throw Error(file + ": --check-output: no recording found to check (no tensor matches '" + spec.key + "')");
      return kExitOk;
    }
  }
  spec.path = file;
  if (!layers_text.empty()) spec.layers = parse_layer_list(layers_text);
  const Recording rec = load_recording(spec);
  const int64_t mismatched = print_recording(rec, positions, vm.count("check-output") != 0, json);
  if (mismatched > 0)
    throw Error(file + ": the recorded attn_output differs from attention recomputed from query/key/value in " +
                std::to_string(mismatched) + " layer(s) (relative L2 above " + format_double(kOutputMismatch) +
                "): check --layout and --attn-output-layout, and that the keys are post-RoPE");
  return kExitOk;
}

}  // namespace kvb::cli
