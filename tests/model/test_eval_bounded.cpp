// Evaluation in bounded memory (sim/model/model_eval.h, issue 21): the exact logits
// kept in a file and read a window at a time (ModelEvalOptions::max_held_base_bytes
// forced to 0 here) give the statistics, NLLs and logits of the held path bit for bit,
// with and without a kl-base file, over several windows, with a positions restriction
// and llama.cpp's second-half rule; a kl-base written by either path is read by the
// other, byte for byte the same file; and evaluate() hands the quantized logits back a
// window at a time instead of holding [T, vocab].
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/formats/registry.h"
#include "sim/io/tensor_store.h"
#include "sim/io/tensor_writer.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"
#include "sim/strategies/uniform.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

// Windows of n_ctx; `bounded`: the exact logits never held (a temporary file in `dir`
// unless a kl-base is given).
ModelEvalOptions options(int64_t n_ctx, bool bounded, const fs::path& dir, fs::path kl_base = {},
                         ScoreRule score = ScoreRule::All) {
  ModelEvalOptions o;
  o.windows = WindowSpec{n_ctx, score};
  o.kl_base = std::move(kl_base);
  if (bounded) o.max_held_base_bytes = 0;
  o.spill_dir = dir;
  return o;
}

// NaN-aware equality of two NLL vectors (NaN at window ends), bit for bit elsewhere.
bool same_nll(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::isnan(a[i]) ? !std::isnan(b[i]) : a[i] != b[i]) return false;
  return true;
}

void check_same_stats(const ModelStats& a, const ModelStats& b) {
  CHECK(a.nll == b.nll);
  CHECK(a.nll_base == b.nll_base);
  CHECK(a.kl == b.kl);
  CHECK(a.same_top == b.same_top);
  CHECK(a.continuations == b.continuations);
  CHECK(a.continuations_base == b.continuations_base);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool directory_empty(const fs::path& dir) { return fs::directory_iterator(dir) == fs::directory_iterator(); }

}  // namespace

TEST_CASE("exact logits kept in a file: the held path's statistics bit for bit, over several windows") {
  const fs::path dir = scratch_dir("eval_bounded_stats");
  const auto model = fixture_model("llama-bytes");
  const int64_t V = model->config().vocab_size;
  // 121 = 3 windows of 40 and a lone last token no window holds (its row stays zero).
  for (const int64_t T : {int64_t{90}, int64_t{121}}) {
    CAPTURE(T);
    const std::vector<int64_t> ids = reference_ids("llama-bytes", static_cast<size_t>(T));
    const ModelEvaluator held(model, ids, ContinuationSpec{2, 8, 6}, "test", nullptr, options(40, false, dir));
    const ModelEvaluator bounded(model, ids, ContinuationSpec{2, 8, 6}, "test", nullptr, options(40, true, dir));
    CHECK(held.base_logits_held());
    CHECK_FALSE(bounded.base_logits_held());
    // The temporary file is unlinked as soon as it is open: nothing is left in its directory.
    CHECK(directory_empty(dir));
    CHECK(same_nll(held.base_nll(), bounded.base_nll()));
    CHECK(held.base_scored_nll() == bounded.base_scored_nll());
    CHECK(held.base_continuations() == bounded.base_continuations());
    const std::string not_held = error_of([&] { (void)bounded.base_logits(); });
    CHECK(has(not_held, "not held in memory"));
    CHECK(has(not_held, "a window at a time"));
    // The exact rows read back from the file are the held ones.
    RowMatrix rows(T, V);
    bounded.read_base_rows(0, T, rows.data());
    CHECK(rows == held.base_logits());
    if (T == 121) CHECK(held.base_logits().row(120).isZero());

    const Plan plan = uniform_plan(held.recording(), "int4-asym-g32");
    RowMatrix held_logits, bounded_logits;
    const ModelStats a = held.evaluate(plan, 0, &held_logits);
    const ModelStats b = bounded.evaluate(plan, 0, &bounded_logits);
    check_same_stats(a, b);
    CHECK(held_logits == bounded_logits);
    CHECK(a.kl.size() == held.scored_positions().size());
    // Without logits_out (one window of quantized logits): the same numbers.
    check_same_stats(held.evaluate(plan, 0), a);
    check_same_stats(bounded.evaluate(plan, 0), a);

    // The quantized logits a window at a time, and the NLL at every position.
    QuantizedRunOutput output;
    std::vector<double> nll;
    RowMatrix streamed = RowMatrix::Zero(T, V);
    int64_t next_start = 0;
    output.nll = &nll;
    output.window_logits = [&](const TokenWindow& w, const float* logits) {
      CHECK(w.start == next_start);
      next_start = w.start + w.length;
      std::copy(logits, logits + w.length * V, streamed.row(w.start).data());
    };
    check_same_stats(bounded.evaluate(plan, 0, nullptr, nullptr, &output), a);
    CHECK(streamed == held_logits);
    CHECK(same_nll(nll, held.next_token_nll_of(held_logits)));

    // A positions restriction (window-local), in every window.
    const std::vector<int64_t> some = {3, 7, 11, 20, 38};
    check_same_stats(held.evaluate(plan, 0, nullptr, &some), bounded.evaluate(plan, 0, nullptr, &some));
    CHECK(bounded.evaluate(plan, 0, nullptr, &some).kl.size() == (T == 90 ? 5u + 5u + 2u : 5u * 3u));
  }

  // llama.cpp's rule (the second half of each window).
  const std::vector<int64_t> ids = reference_ids("llama-bytes", 100);
  const ModelEvaluator held(model, ids, ContinuationSpec{}, "test", nullptr,
                            options(32, false, dir, {}, ScoreRule::SecondHalf));
  const ModelEvaluator bounded(model, ids, ContinuationSpec{}, "test", nullptr,
                               options(32, true, dir, {}, ScoreRule::SecondHalf));
  const Plan plan = uniform_plan(held.recording(), "int2-asym-g32");
  check_same_stats(held.evaluate(plan, 3), bounded.evaluate(plan, 3));
}

TEST_CASE("a kl-base written by the held path is read by the bounded one and the other way round") {
  const fs::path dir = scratch_dir("eval_bounded_kl_base");
  const fs::path from_held = dir / "held.safetensors", from_bounded = dir / "bounded.safetensors";
  const auto model = fixture_model("llama-bytes");
  const int64_t V = model->config().vocab_size;
  const std::vector<int64_t> ids = reference_ids("llama-bytes", 97);  // 3 windows of 32, a lone last token
  const ModelEvaluator held(model, ids, ContinuationSpec{}, "test", nullptr, options(32, false, dir, from_held));
  const ModelEvaluator bounded(model, ids, ContinuationSpec{}, "test", nullptr, options(32, true, dir, from_bounded));
  REQUIRE(fs::exists(from_held));
  REQUIRE(fs::exists(from_bounded));
  CHECK_FALSE(bounded.kl_base_reused());
  CHECK(bounded.base_logits_file() == from_bounded);  // a given kl-base file stays
  // Written window by window or whole: the same bytes.
  CHECK(file_bytes(from_held) == file_bytes(from_bounded));
  const KlBaseReader reader(from_bounded);
  CHECK(reader.header().tokens == ids);
  CHECK(reader.header().vocab == V);
  CHECK(reader.header().n_ctx == 32);
  CHECK(reader.header().model == "llama-bytes");
  RowMatrix rows(97, V);
  reader.read_rows(0, 97, rows.data());
  CHECK(rows == held.base_logits());
  CHECK(rows.row(96).isZero());
  // write_kl_base (whole) writes the same file too.
  write_kl_base(dir / "whole.safetensors", reader.header(), rows);
  CHECK(file_bytes(dir / "whole.safetensors") == file_bytes(from_held));

  const Plan plan = uniform_plan(held.recording(), "int4-asym-g32");
  const ModelStats reference = held.evaluate(plan, 0);
  const ModelEvaluator bounded_reads_held(model, ids, ContinuationSpec{}, "test", nullptr,
                                          options(32, true, dir, from_held));
  const ModelEvaluator held_reads_bounded(model, ids, ContinuationSpec{}, "test", nullptr,
                                          options(32, false, dir, from_bounded));
  CHECK(bounded_reads_held.kl_base_reused());
  CHECK(held_reads_bounded.kl_base_reused());
  CHECK(held_reads_bounded.base_logits() == held.base_logits());
  CHECK(same_nll(bounded_reads_held.base_nll(), held.base_nll()));
  check_same_stats(bounded_reads_held.evaluate(plan, 0), reference);
  check_same_stats(held_reads_bounded.evaluate(plan, 0), reference);
  check_same_stats(bounded.evaluate(plan, 0), reference);
  CHECK(bounded_reads_held.recording().token_ids == held.recording().token_ids);
  CHECK(bounded_reads_held.recording().layers.front().key.data == held.recording().layers.front().key.data);

  // The checks still read only the header: another --ctx is refused by name.
  const std::string ctx_msg = error_of([&] {
    (void)ModelEvaluator(model, ids, ContinuationSpec{}, "test", nullptr, options(16, true, dir, from_bounded));
  });
  CHECK(has(ctx_msg, "n_ctx = 32"));
  // So is another precision of the exact run (a CUDA --precision tf32 run reusing an fp32 file).
  ModelEvalOptions tf32 = options(32, true, dir, from_bounded);
  tf32.precision = "tf32";
  const std::string precision_msg =
      error_of([&] { (void)ModelEvaluator(model, ids, ContinuationSpec{}, "test", nullptr, tf32); });
  CHECK(has(precision_msg, "computed in fp32, this run computes in tf32"));
  CHECK(reader.header().precision == "fp32");
  // A file that is no kl-base, or whose logits are not F32 [T, vocab], is named.
  write_safetensors(dir / "other.safetensors", {TensorToWrite::of_ints("input_ids", {2}, ids.data())});
  CHECK(has(error_of([&] { (void)KlBaseReader(dir / "other.safetensors"); }), "not a kl-base file"));

  // Its checksum covers every row: one logit changed in the third window (the first
  // window is also checked against a fresh forward pass), or in the last row no window
  // holds, is refused, bounded or held; the unchanged file is taken.
  REQUIRE(reader.checksum().has_value());
  const std::string good = file_bytes(from_bounded);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), sizeof header_bytes);  // safetensors: u64 LE, then JSON
  for (int64_t row : {70, 96}) {
    CAPTURE(row);
    std::string bad = good;
    const size_t at = 8 + header_bytes + static_cast<size_t>(row * V + 3) * sizeof(float);  // logits come first
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    const fs::path damaged = dir / "damaged.safetensors";
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bad;
    for (bool bounded_run : {true, false}) {
      const std::string msg = error_of([&] {
        (void)ModelEvaluator(model, ids, ContinuationSpec{}, "test", nullptr, options(32, bounded_run, dir, damaged));
      });
      CHECK(has(msg, "changed or damaged"));
      CHECK(has(msg, damaged.string()));
    }
  }
}

TEST_CASE("LogitsChecksum: the same for any split of the values into calls; every value and its place count") {
  std::vector<float> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 3.0f;
  LogitsChecksum whole;
  whole.add(v.data(), 37);
  for (int64_t cut : {0, 1, 3, 4, 5, 36, 37}) {
    LogitsChecksum split;
    split.add(v.data(), cut);
    split.add(v.data() + cut, 37 - cut);
    CHECK(split.value() == whole.value());
  }
  std::vector<float> swapped = v;
  std::swap(swapped[4], swapped[8]);  // the same lane: order within a lane counts
  std::vector<float> zero_sign = v;
  zero_sign[6] = -0.0f;  // v[6] is 0: -0 has other bits
  std::vector<float> longer = v;
  longer.push_back(0.0f);  // a trailing zero counts
  for (const std::vector<float>* other : {&swapped, &zero_sign, &longer}) {
    LogitsChecksum c;
    c.add(other->data(), static_cast<int64_t>(other->size()));
    CHECK(c.value() != whole.value());
  }
}

TEST_CASE("the bounded path's results do not depend on the thread count") {
  const fs::path dir = scratch_dir("eval_bounded_threads");
  const auto model = fixture_model("llama-bytes");
  const std::vector<int64_t> ids = reference_ids("llama-bytes", 96);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const ModelEvaluator one(model, ids, ContinuationSpec{}, "test", nullptr, options(32, true, dir));
  const Plan plan = uniform_plan(one.recording(), "int8-asym-g32");
  const ModelStats a = one.evaluate(plan, 1);
  omp_set_num_threads(2);
  const ModelEvaluator two(model, ids, ContinuationSpec{}, "test", nullptr, options(32, true, dir));
  const ModelStats b = two.evaluate(plan, 1);
  omp_set_num_threads(saved);
  check_same_stats(a, b);
  CHECK(same_nll(one.base_nll(), two.base_nll()));
}
