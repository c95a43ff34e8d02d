#include "sim/formats/registry.h"

#include <algorithm>
#include <limits>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/fp4_format.h"
#include "sim/formats/fp8_format.h"
#include "sim/formats/ggml_format.h"
#include "sim/formats/int_format.h"
#include "sim/formats/keep_format.h"
#include "sim/formats/nf4_format.h"
#include "sim/formats/nuq_format.h"
#include "sim/formats/outlier_format.h"
#include "sim/formats/prerope_format.h"
#include "sim/formats/qjl_format.h"
#include "sim/formats/turbo_format.h"

namespace kvb {

// The format table. One entry per family; order is the order users see. Each example's
// maximum relative MSE is 1.25x the relative MSE its round trip measures on N(0, 1) data
// (tests/formats/test_format_table.cpp), rounded up to two digits.
std::string table_span_error(int64_t tokens, int64_t head_dim) {
  const int64_t max_elements = std::numeric_limits<int64_t>::max() / kMaxExampleBitsPerElement;
  if (tokens < 1 || head_dim < 1 || tokens <= max_elements / head_dim) return {};
  return "tokens " + std::to_string(tokens) + " x head_dim " + std::to_string(head_dim) + " is over " +
         std::to_string(max_elements) + " elements: the span's bit count would overflow a 64-bit integer; give "
         "fewer tokens";
}

const std::vector<FormatFamily>& format_families() {
  static const std::vector<FormatFamily> families = {
      {"int", "int<b>-<sym|asym>-<g<G>|tok|ch<G>|ch>[-s<dtype>][-z<dtype>]",
       "integer b=1..8, absmax (sym) or min-max (asym), per group of channels, per token or per channel",
       {{"int4-asym-g32", 0.0076}, {"int4-sym-g32", 0.012}, {"int2-asym-g64", 0.26}, {"int8-sym-tok", 5.2e-5},
        {"int2-asym-ch32", 0.2}, {"int3-asym-ch", 0.068}, {"int1-sym-g32", 0.44}, {"int1-asym-g16", 1.6},
        {"int4-asym-g32-sbf16-zfp32", 0.0076}, {"int5-sym-g16-sfp32", 0.002}},
       &parse_int_format, /*cuda_twin=*/true},
      {"keep", "keep-<fp16|bf16|fp32>", "values stored unquantized at fp16, bf16 or fp32 (sinks, windows)",
       {{"keep-fp16", 5.5e-8}, {"keep-bf16", 3.5e-6}, {"keep-fp32", 0.0}},
       &parse_keep_format, /*cuda_twin=*/true},
      {"ggml", "<q4_0|q4_1|q5_0|q5_1|q8_0|iq4_nl>[-ntry<N>]",
       "llama.cpp/ggml blocks of 32 along head_dim, bit-exact with ggml's reference quantizers "
       "(iq4_nl-ntry<N>: quantize_iq4_nl's scale search)",
       {{"q4_0", 0.0092}, {"q4_1", 0.0076}, {"q5_0", 0.0023}, {"q5_1", 0.0018}, {"q8_0", 3.6e-5}, {"iq4_nl", 0.0078},
        {"iq4_nl-ntry7", 0.0073}},
       &parse_ggml_format, /*cuda_twin=*/true},
      {"turbo", "turbo-<b>[-o<n|p%>b<B>[-cal<N>]]",
       "randomized Hadamard rotation + b-bit N(0,1) Lloyd-Max codebook, fp16 norm per vector (TurboQuant/HIGGS); "
       "-o<n>b<B>: the n (or p% of head_dim) highest-energy channels as a separate B-bit part",
       {{"turbo-1", 0.45}, {"turbo-2", 0.15}, {"turbo-3", 0.042}, {"turbo-4", 0.012}, {"turbo-8", 5.1e-5},
        {"turbo-2-o50%b3", 0.091}, {"turbo-3-o50%b4", 0.027}, {"turbo-2-o32b3", 0.12}, {"turbo-3-o32b5-cal16", 0.032},
        {"turbo-2-o12.5%b4", 0.13}},
       &parse_turbo_format},
      {"qjl", "qjl-m<m>",
       "keys only: 1-bit sketch sign(S k) of m Gaussian projections + fp16 norm; attention uses the unbiased "
       "inner-product estimator",
       {{"qjl-m64", 1.3}, {"qjl-m128", 0.92}, {"qjl-m256", 0.62}},
       &parse_qjl_format},
      {"fp8", "fp8-<e4m3|e5m2>[-s<scale>|-cal<N>|-tok]",
       "OCP FP8, round-to-nearest-even, saturating; static scale (default 1), span scale calibrated on the first N "
       "tokens, or per-token scale (fp32)",
       {{"fp8-e4m3", 0.0009}, {"fp8-e5m2", 0.0035}, {"fp8-e4m3-s0.25", 0.0009}, {"fp8-e4m3-cal64", 0.00088},
        {"fp8-e5m2-cal64", 0.0035}, {"fp8-e4m3-tok", 0.00082}},
       &parse_fp8_format, /*cuda_twin=*/true},
      {"fp4", "<mxfp4|nvfp4>",
       "E2M1 with block scales: mxfp4 = OCP MX (block 32, E8M0 scale); nvfp4 = block 16, E4M3 scale, fp32 per span",
       {{"mxfp4", 0.017}, {"nvfp4", 0.012}},
       &parse_fp4_format, /*cuda_twin=*/true},
      {"nf4", "nf4-g<G>[-s<fp16|bf16|fp32>]", "QLoRA NormalFloat4 codebook with an absmax scale per group of G channels",
       {{"nf4-g64", 0.011}, {"nf4-g32", 0.0096}, {"nf4-g64-sfp32", 0.011}},
       &parse_nf4_format, /*cuda_twin=*/true},
      {"nuq", "nuq<b>[-cal<N>][-wsq]",
       "per-channel non-uniform codebooks (KVQuant nuq): 1-D k-means per channel on the span's first N tokens "
       "(default all), optionally x²-weighted; codebooks counted",
       {{"nuq4", 0.014}, {"nuq4-cal256", 0.014}, {"nuq3-cal256-wsq", 0.096}, {"nuq2-cal64", 0.16}},
       &parse_nuq_format},
      {"outliers", "outliers<p>%:<format>",
       "dense-and-sparse (KVQuant): the round(p% of head_dim) largest magnitudes per vector kept as fp16 + 16-bit "
       "index, the rest quantized with <format>",
       {{"outliers1%:nuq4-cal256", 0.012}, {"outliers0.5%:int4-asym-g32", 0.0068}, {"outliers2%:turbo-3", 0.035}},
       &parse_outlier_format},
      {"prerope", "prerope:<format>",
       "keys quantized before RoPE with <format>, RoPE re-applied after dequantization (needs pre-RoPE keys); "
       "values use <format> unchanged",
       {{"prerope:nuq4-cal256", 0.014}, {"prerope:int2-asym-ch32", 0.2}, {"prerope:outliers1%:nuq3-cal256", 0.034}},
       &parse_prerope_format},
  };
  return families;
}

const std::vector<FormatAlias>& format_aliases() {
  static const std::vector<FormatAlias> aliases = {
      {"fp16", "keep-fp16", "an unquantized half-precision cache"},
      {"bf16", "keep-bf16", "an unquantized bfloat16 cache"},
      {"fp32", "keep-fp32", "the fp32 reference"},
      {"kivi-2-keys", "int2-asym-ch32", "KIVI-2 keys: 2-bit per-channel groups of 32 tokens (without its residual window)"},
      {"kivi-2-values", "int2-asym-g32", "KIVI-2 values: 2-bit per-token groups of 32 channels (without its residual window)"},
      {"kivi-4-keys", "int4-asym-ch32", "KIVI-4 keys: 4-bit per-channel groups of 32 tokens (without its residual window)"},
      {"kivi-4-values", "int4-asym-g32", "KIVI-4 values: 4-bit per-token groups of 32 channels (without its residual window)"},
      {"quanto-int4", "int4-asym-g64",
       "Hugging Face QuantizedCache, quanto backend, nbits=4, q_group_size=64 (without its residual window)"},
      {"quanto-int2", "int2-asym-g64",
       "Hugging Face QuantizedCache, quanto backend, nbits=2, q_group_size=64 (without its residual window)"},
      {"turboquant-2", "turbo-2", "TurboQuant (MSE variant) at 2 bits: rotation + Lloyd-Max, fp16 norm"},
      {"turboquant-3", "turbo-3", "TurboQuant (MSE variant) at 3 bits"},
      {"turboquant-4", "turbo-4", "TurboQuant (MSE variant) at 4 bits"},
      {"turboquant-2.5", "turbo-2-o50%b3",
       "TurboQuant-style 2.5-bit split: the higher-energy half of the channels at 3 bits, the rest at 2, one fp16 "
       "norm each"},
      {"turboquant-3.5", "turbo-3-o50%b4",
       "TurboQuant-style 3.5-bit split: the higher-energy half of the channels at 4 bits, the rest at 3, one fp16 "
       "norm each"},
      {"kvquant-nuq4-1%", "prerope:outliers1%:nuq4-cal256",
       "KVQuant nuq4-1%: pre-RoPE keys, 1% dense-and-sparse outliers, per-channel 4-bit non-uniform codebooks "
       "(fitted on the first 256 tokens of each span instead of offline calibration data)"},
      {"kvquant-nuq3-1%", "prerope:outliers1%:nuq3-cal256", "KVQuant nuq3-1% (as kvquant-nuq4-1%, 3 bits)"},
      {"kvquant-nuq2-1%", "prerope:outliers1%:nuq2-cal256", "KVQuant nuq2-1% (as kvquant-nuq4-1%, 2 bits)"},
      {"nf4", "nf4-g64", "QLoRA NF4 with its block size 64 (fp16 absmax; QLoRA stores fp32 or double-quantized)"},
      {"fp8", "fp8-e4m3", "vLLM's fp8 KV cache (E4M3, scale 1.0 unless calibrated)"},
  };
  return aliases;
}

FormatPtr make_format(std::string_view name) {
  for (const FormatAlias& a : format_aliases())
    if (a.alias == name) return make_format(a.canonical);
  for (const FormatFamily& f : format_families())
    if (FormatPtr p = f.parse(name)) return p;
  std::vector<std::string> known;
  for (const FormatFamily& f : format_families()) for (const FormatExample& ex : f.examples) known.push_back(ex.name);
  for (const FormatAlias& a : format_aliases()) known.push_back(a.alias);
  std::string msg = "unknown format '" + std::string(name) + "'";
  msg += did_you_mean(name, known);
  msg += "; families:";
  for (const FormatFamily& f : format_families()) msg += " " + f.syntax + ";";
  msg += " run `kvbudget formats` for the full table";
  throw ConfigError(msg);
}

const FormatFamily& format_family(const Format& format) {
  const std::string name = format.name();
  for (const FormatFamily& f : format_families())
    if (f.parse(name)) return f;
  throw Error("format '" + name + "' is in no family of the format table");
}

bool has_cuda_twin(const Format& format) {
  const std::string name = format.name();
  for (const FormatFamily& f : format_families())
    if (f.parse(name)) return f.cuda_twin;
  return false;  // a format outside the table (a test's stand-in) has no twin
}

}  // namespace kvb
