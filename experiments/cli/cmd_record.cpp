// `kvbudget record MODEL_DIR --text FILE --out FILE.safetensors`: runs a checkpoint
// on a text and writes what attention consumed in every layer, in the recording
// layout the loaders read (sim/io/recording_writer.h).
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "experiments/cli/commands.h"
#include "experiments/cli/interrupt.h"
#include "experiments/cli/model_input.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/recording_writer.h"
#include "sim/io/tensor_writer.h"
#include "sim/model/model_eval.h"

namespace po = boost::program_options;

namespace kvb::cli {

int cmd_record(const Args& args) {
  po::options_description opts("kvbudget record MODEL_DIR (--text FILE | --tokens FILE) --out FILE.safetensors [options]");
  ModelInput in;
  std::string out, dtype_text = "f16";
  opts.add_options()("help,h", "show this help")("out,o", po::value(&out), "output .safetensors file")(
      "dtype", po::value(&dtype_text)->default_value("f16"), "stored precision of the tensors: f16, bf16 or f32");
  in.add_options(opts);
  po::variables_map vm;
  if (!in.parse(args, opts, "record", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nWrites, per layer l: layers.l.query [q_heads, T, head_dim], layers.l.key and layers.l.value\n"
                 "[kv_heads, T, head_dim] (post-RoPE), layers.l.key_pre_rope (RoPE models) and\n"
                 "layers.l.attn_output [T, q_heads*head_dim], plus input_ids [T]: what `kvbudget run` and\n"
                 "`kvbudget inspect` read.\n";
    return kExitOk;
  }
  if (out.empty()) throw ConfigError("missing --out FILE.safetensors");
  if (std::filesystem::path(out).extension() != ".safetensors")
    throw ConfigError("--out " + out + ": a recording is written as .safetensors");
  const DType dtype = parse_float_dtype(dtype_text, "--dtype");
  require_writable_output(out, "--out");
  // From here on an interrupt removes the unfinished --out file and exits 128 + signal.
  const ExitOnInterrupt exit_on_interrupt("record");

  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<const Transformer> model = in.load_model();
  const std::vector<int64_t> tokens = in.load_tokens(model->config());
  const RecordedRun run = record_exact_run(*model, tokens, in.checkpoint, in.token_origin());
  const Recording& rec = run.recording;
  try {
    write_recording(out, rec, dtype);
  } catch (const Error& e) {
    if (dtype == DType::F32 || std::string(e.what()).find(" overflows ") == std::string::npos) throw;
    throw Error(std::string(e.what()) + " (--dtype f32 keeps every value)");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s\nrecorded %s (%s) to %s in %.2f s; PPL %.4f (mean NLL %.6f nats over %zu positions)\n",
              model->config().summary().c_str(), rec.summary().c_str(), dtype_name(dtype), out.c_str(), secs,
              std::exp(run.mean_nll), run.mean_nll, run.nll.size());
  return kExitOk;
}

}  // namespace kvb::cli
