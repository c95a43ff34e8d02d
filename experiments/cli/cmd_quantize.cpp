// `kvbudget quantize FILE --format NAME`: quantizes and dequantizes one tensor of a
// tensor file with any format or preset, writes the dequantized tensor and the codes,
// and prints the error and the exact bits per element.
//
// The tensor is read as rows of its last dimension: head_dim = the last dimension,
// every dimension before it flattened into rows (tokens). By default all rows form
// one span (one cache unit: per-channel statistics, calibration tokens and the
// NVFP4 tensor scale cover every row); --rows-per-span R cuts them into spans of R
// rows (e.g. R = tokens for a [heads, tokens, head_dim] tensor), span s being unit
// kv_head = s of layer 0, so seeded formats use a different rotation per span.
//
// Pre-RoPE formats (prerope:<inner>, the kvquant presets) quantize the keys before
// RoPE and re-apply it: --pre-rope NAME names the pre-RoPE keys of the same shape
// (a recording's layers.<l>.key_pre_rope), --rope-theta the base of an unscaled RoPE
// (default: the file's metadata, rope_from_metadata: rope_theta else 10000, and the
// scaled frequencies rope_inv_freq that `kvbudget record` writes for models with RoPE
// scaling). Rows then hold positions 0..R-1 in every span, and R defaults to the
// tensor's second-to-last dimension (tokens).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "experiments/cli/commands.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/core/tensor.h"
#include "sim/formats/prerope_format.h"
#include "sim/formats/registry.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/tensor_store.h"
#include "sim/io/tensor_writer.h"
#include "sim/reconstruction.h"
#include "sim/recording.h"
#include "sim/strategies/presets.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

std::string pick_tensor(const TensorStore& store, const std::string& requested) {
  if (!requested.empty()) {
    if (!store.contains(requested)) {
      std::vector<std::string> names;
      for (const TensorInfo& t : store.list()) names.push_back(t.name);
      std::string msg = store.path().string() + ": no tensor '" + requested + "'";
      msg += did_you_mean(requested, names);
      throw ConfigError(msg);
    }
    return requested;
  }
  const std::vector<TensorInfo> all = store.list();
  if (all.size() == 1) return all[0].name;
  std::vector<std::string> names;
  for (const TensorInfo& t : all) names.push_back(t.name);
  throw ConfigError(store.path().string() + " holds " + std::to_string(all.size()) +
                    " tensors; pick one with --tensor (" + join(names, ", ") + ")");
}

void write_dequantized(const std::filesystem::path& path, const std::string& name, const Tensor& t,
                       const std::string& format) {
  const std::string ext = path.extension().string();
  if (ext == ".npy") write_npy_f32(path, t.shape, t.ptr());
  else if (ext == ".safetensors") write_safetensors_f32(path, {{name, t.shape, t.ptr()}}, {{"format", format}});
  else throw ConfigError("--dequant " + path.string() + ": the extension must be .npy or .safetensors");
}

// What a tensor of that name holds when --kind does not say: "value" for a name whose
// last part is value or values (layers.0.value in a recording, past_values), else "key".
std::string kind_of_tensor_name(const std::string& name) {
  const size_t cut = name.find_last_of("./");
  const std::string last = cut == std::string::npos ? name : name.substr(cut + 1);
  return last.ends_with("value") || last.ends_with("values") ? "value" : "key";
}

// Each span of rows_per_span rows (positions 0..R-1, see quantize_tensor) of the
// pre-RoPE keys must turn into x's rows under RoPE with --rope-theta (or the file's
// RoPE): else a prerope: format re-applies another rotation than the keys had.
void check_tensor_pre_rope_keys(const Tensor& x, const Tensor& pre_rope, int64_t rows_per_span,
                                const SpanSource& source, const std::string& pre_rope_name) {
  const int64_t d = x.shape.back(), rows = x.numel() / d;
  check_pre_rope_key_rows(x.ptr(), pre_rope.ptr(), rows, d, rows_per_span,
                          unit_span(source, 0, 0, Kind::Key, 0, pre_rope.ptr(), d),
                          std::string(source.name) + " with --pre-rope " + pre_rope_name,
                          "a wrong --rope-theta (default: the file's rope_theta metadata, else 10000; give the model's), "
                          "or spans whose rows are not positions 0.." + std::to_string(rows_per_span - 1) +
                              " (--rows-per-span " + std::to_string(rows_per_span) +
                              ": each span restarts at position 0; give the tensor's tokens per head, the default)");
}

// Keys and values are floating point: an integer tensor (token ids, a quantized cache's
// codes) read as numbers would be quantized without a word.
void require_float_tensor(const TensorStore& store, const std::string& name, const std::string& input) {
  const DType stored = store.info(name).dtype;
  if (!dtype_is_float(stored))
    throw ConfigError(input + ": tensor '" + name + "' holds integers (" + dtype_name(stored) +
                      "), not keys or values: quantize takes a floating-point tensor (F32, F16, BF16, F64); "
                      "a quantized cache's codes must be dequantized first");
}

}  // namespace

int cmd_quantize(const Args& args) {
  po::options_description opts("kvbudget quantize FILE --format NAME [options]");
  std::string input, format, tensor, out_prefix, old_out_prefix, dequant_path, codes_path, kind;
  int64_t rows_per_span = 0;
  int64_t seed_arg = 0;
  std::string pre_rope_tensor;
  double rope_theta = 0;
  opts.add_options()("help,h", "show this help")("format,f", po::value(&format), "format or preset (kvbudget formats)")(
      "tensor,t", po::value(&tensor), "tensor name (default: the file's only tensor)")(
      "prefix", po::value(&out_prefix),
      "write PREFIX.dequant.npy (.safetensors for a safetensors input), PREFIX.codes.bin and PREFIX.codes.bin.json")(
      "out,o", po::value(&old_out_prefix), "deprecated spelling of --prefix (--out names a file or a results base "
                                            "directory everywhere else)")(
      "dequant", po::value(&dequant_path), "write the dequantized tensor here (.npy or .safetensors), same shape")(
      "codes", po::value(&codes_path), "write the codes here (raw bytes; layout in CODES.json)")(
      "rows-per-span", po::value(&rows_per_span),
      "rows per span, >= 1 (default: all rows are one span; with --pre-rope, the tensor's tokens axis, one span per "
      "head)")(
      "kind", po::value(&kind),
      "key or value: what the spans are (QJL stores keys only; default: value for a tensor named *value or "
      "*values, as layers.0.value of a recording, else key)")(
      "pre-rope", po::value(&pre_rope_tensor),
      "tensor of the same file holding the pre-RoPE keys (for prerope:<inner> formats, e.g. layers.0.key_pre_rope)")(
      "rope-theta", po::value(&rope_theta), "RoPE base with --pre-rope (default: the file's rope_theta, else 10000)")(
      "seed", po::value(&seed_arg), "seed of seeded formats (rotations, sketches)")("json", "print the result as JSON");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "input", po::value(&input), 1, "quantize", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nReads FILE (.npy, .npz or safetensors) as rows of its last dimension\n"
                 "(head_dim); every earlier dimension is flattened into rows. Prints relative MSE, SNR and max abs\n"
                 "error, and the exact bits per element (all metadata counted). ggml formats dump ggml's own\n"
                 "block bytes; other formats dump the layout CODES.json describes.\n";
    return kExitOk;
  }
  if (input.empty() || format.empty()) {
    std::cerr << "kvbudget quantize: need FILE and --format\n\n" << opts;
    return kExitUsage;
  }
  if (!old_out_prefix.empty()) {
    if (!out_prefix.empty()) throw ConfigError("give --prefix only (--out is its deprecated spelling)");
    std::fprintf(stderr, "kvbudget quantize: warning: --out PREFIX is deprecated; write --prefix %s\n",
                 old_out_prefix.c_str());
    out_prefix = old_out_prefix;
  }
  if (!kind.empty() && kind != "key" && kind != "value")
    throw ConfigError("--kind must be key or value, got '" + kind + "'");
  const uint64_t seed = checked_seed(seed_arg, "--seed");

  FormatPtr f;
  try {
    f = make_format(format);
  } catch (const ConfigError& e) {
    throw ConfigError("--format: " + std::string(e.what()) +
                      preset_not_format_hint(format, "quantize takes a format (`kvbudget strategies` lists the preset's "
                                                     "formats; `kvbudget eval --strategy " + format + "` applies it)"));
  }
  if (!out_prefix.empty()) {
    if (dequant_path.empty())
      dequant_path = out_prefix + (std::filesystem::path(input).extension() == ".safetensors" ? ".dequant.safetensors"
                                                                                                : ".dequant.npy");
    if (codes_path.empty()) codes_path = out_prefix + ".codes.bin";
  }
  for (const auto& [path, option] : {std::pair{dequant_path, "--dequant"}, std::pair{codes_path, "--codes"}}) {
    if (path.empty()) continue;
    require_writable_output(path, option);
    std::error_code ec;
    if (std::filesystem::equivalent(path, input, ec))
      throw ConfigError(std::string(option) + " " + path + ": is the input file; write the output elsewhere");
  }
  const std::unique_ptr<TensorStore> store = TensorStore::open(input);
  const std::string name = pick_tensor(*store, tensor);
  require_float_tensor(*store, name, input);
  const bool kind_from_name = kind.empty();
  if (kind_from_name) kind = kind_of_tensor_name(name);
  const std::string kind_origin = kind_from_name ? " (from the tensor's name; --kind says otherwise)" : "";
  if (f->keys_only() && kind == "value")
    throw ConfigError("format '" + f->name() + "' stores keys only (a sketch for attention logits); it cannot " +
                      "quantize values: tensor '" + name + "' is quantized as values" + kind_origin);
  if (f->reads_pre_rope_keys() && kind == "key" && pre_rope_tensor.empty())
    throw ConfigError("format '" + f->name() + "' quantizes keys before RoPE: give --pre-rope NAME, the tensor of " +
                      "pre-RoPE keys (e.g. layers.0.key_pre_rope in a recording), or --kind value");
  const Tensor x = store->read_f32(name);
  if (x.rank() < 1)
    throw ConfigError(input + ": tensor '" + name + "' is a scalar (shape []); quantize needs at least one axis");
  if (x.numel() == 0) throw ConfigError(input + ": tensor '" + name + "' is empty (shape " + shape_str(x.shape) + ")");
  // Errors and SNR of NaN or Inf input mean nothing (and formats disagree on them).
  require_finite(x, input + ": tensor '" + name + "'");
  const int64_t d = x.shape.back(), rows = x.numel() / d;
  if (vm.count("rows-per-span") && rows_per_span < 1)
    throw ConfigError("--rows-per-span must be >= 1, got " + std::to_string(rows_per_span));
  const std::string source_name = input + ":" + name;
  SpanSource source;
  source.name = source_name.c_str();
  RopeInfo rotation;  // theta, and scaled frequencies if the file has them
  Tensor pre_rope;
  if (!pre_rope_tensor.empty()) {
    const std::string pre_rope_name = pick_tensor(*store, pre_rope_tensor);
    require_float_tensor(*store, pre_rope_name, input);
    pre_rope = store->read_f32(pre_rope_name);
    if (pre_rope.shape != x.shape)
      throw ConfigError("--pre-rope " + pre_rope_tensor + ": shape " + shape_str(pre_rope.shape) + " is not the shape " +
                        shape_str(x.shape) + " of '" + name + "'");
    require_finite(pre_rope, input + ": tensor '" + pre_rope_tensor + "'");
    if (vm.count("rope-theta")) {
      if (!std::isfinite(rope_theta) || !(rope_theta > 0))
        throw ConfigError("--rope-theta must be a finite number > 0, got " + format_double(rope_theta));
      rotation.theta = rope_theta;
    } else {
      try {
        rotation = rope_from_metadata(store->metadata(), d, input);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + "; give --rope-theta");
      }
    }
    source.rope_applied = true;
    source.rope_theta = rotation.theta;
    source.rope_inv_freq = &rotation.inv_freq;
    if (rows_per_span <= 0 && x.rank() >= 2) rows_per_span = x.shape[static_cast<size_t>(x.rank() - 2)];
  } else if (vm.count("rope-theta")) {
    throw ConfigError("--rope-theta needs --pre-rope (the tensor of pre-RoPE keys)");
  }
  if (rows_per_span <= 0) rows_per_span = rows;
  if (!pre_rope_tensor.empty() && kind == "key")
    check_tensor_pre_rope_keys(x, pre_rope, rows_per_span, source, pre_rope_tensor);
  const TensorQuantization r = quantize_tensor(x, *f, rows_per_span, kind == "key" ? Kind::Key : Kind::Value, seed,
                                               source, pre_rope_tensor.empty() ? nullptr : &pre_rope);

  if (!dequant_path.empty()) write_dequantized(dequant_path, name, r.dequantized, f->name());
  const int64_t spans = (rows + rows_per_span - 1) / rows_per_span;
  nlohmann::ordered_json info = {{"input", input},
                                 {"tensor", name},
                                 {"shape", x.shape},
                                 {"rows", rows},
                                 {"head_dim", d},
                                 {"spans", spans},
                                 {"rows_per_span", rows_per_span},
                                 {"kind", kind},
                                 {"pre_rope", pre_rope_tensor.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(pre_rope_tensor)},
                                 {"seed", seed},
                                 {"format", f->name()},
                                 {"storage_bits", r.storage_bits},
                                 {"bpe", static_cast<double>(r.storage_bits) / static_cast<double>(x.numel())},
                                 {"relative_mse", r.relative_mse()},
                                 {"snr_db", r.snr_db()},
                                 {"max_abs_error", r.max_abs},
                                 {"nonfinite_outputs", r.nonfinite},
                                 {"clipped_values", r.clipped}};
  if (!codes_path.empty()) {
    write_bytes(codes_path, r.codes.bytes().data(), r.codes.bytes().size());
    nlohmann::ordered_json side = info;
    side["code_bits"] = r.codes.bits();
    side["code_bytes"] = r.codes.bytes().size();
    side["code_layout"] = f->code_layout() + (spans > 1 ? "; spans follow each other in the bit stream" : "");
    side.erase("relative_mse");
    side.erase("snr_db");
    side.erase("max_abs_error");
    side.erase("nonfinite_outputs");
    side.erase("clipped_values");
    const std::string text = side.dump(2) + "\n";
    write_bytes(codes_path + ".json", text.data(), text.size());
  }
  if (vm.count("json")) {
    // JSON has no infinities: null, with nonfinite_outputs telling a lossless result
    // (snr_db null, relative_mse 0) from an overflowed one (both null).
    for (const char* k : {"relative_mse", "snr_db", "max_abs_error"})
      if (!std::isfinite(info[k].get<double>())) info[k] = nullptr;
    std::printf("%s\n", info.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s: tensor '%s' %s -> %lld rows x head_dim %lld, %lld span(s)\n", input.c_str(), name.c_str(),
              shape_str(x.shape).c_str(), static_cast<long long>(rows), static_cast<long long>(d),
              static_cast<long long>(spans));
  std::printf("format        %s\n", f->name().c_str());
  std::printf("kind          %s%s\n", kind.c_str(), kind_origin.c_str());
  std::printf("bits/element  %.6f  (%llu bits = %.1f bytes, all metadata counted)\n",
              static_cast<double>(r.storage_bits) / static_cast<double>(x.numel()),
              static_cast<unsigned long long>(r.storage_bits), static_cast<double>(r.storage_bits) / 8.0);
  std::printf("relative MSE  %.6g\n", r.relative_mse());
  if (r.nonfinite) std::printf("SNR           -inf dB (non-finite output)\n");
  else if (r.err2 > 0) std::printf("SNR           %.3f dB\n", r.snr_db());
  else std::printf("SNR           inf (lossless)\n");
  std::printf("max abs error %.6g\n", r.max_abs);
  if (r.nonfinite)
    std::printf("warning       %lld of %lld dequantized values are NaN or infinite: the input overflows %s (e.g. fp16 "
                "scales saturate beyond 65504)\n",
                static_cast<long long>(r.nonfinite), static_cast<long long>(x.numel()), f->name().c_str());
  if (r.clipped)
    std::printf("warning       %lld of %lld values lie beyond the range of %s and come back clipped (a stored scale or "
                "zero saturated at its dtype's largest value, or a static / calibrated fp8 scale is too small)\n",
                static_cast<long long>(r.clipped), static_cast<long long>(x.numel()), f->name().c_str());
  if (f->keys_only())
    std::printf("note          %s keeps only a sketch: the error is that of its decoded direction; attention in the "
                "simulator uses its inner-product estimator instead\n",
                f->name().c_str());
  if (!dequant_path.empty()) std::printf("dequantized   %s\n", dequant_path.c_str());
  if (!codes_path.empty())
    std::printf("codes         %s (%zu bytes; layout in %s.json)\n", codes_path.c_str(), r.codes.bytes().size(),
                codes_path.c_str());
  return kExitOk;
}

}  // namespace kvb::cli
