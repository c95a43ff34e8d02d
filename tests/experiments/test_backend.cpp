// Where a backend plugs in (experiments/backend.h): make_measurer() creates the
// backend's Measurer, Measurers keeps one per (backend, recording) for a run, and
// planning_backend() says which backend the optimal allocator's tables are measured
// on while plans are built. (A CUDA device's measurer: tests/gpu/test_measurer.cpp.)
#include "experiments/backend.h"
#include "sim/core/error.h"
#include "recording_test_util.h"
#include "test_util.h"

using namespace kvb;

TEST_CASE("make_measurer: the CPU simulator on cpu; cuda needs a CUDA build and a device") {
  const Recording rec = test::random_recording(2, 1, 32, 32, 5);
  const std::unique_ptr<Measurer> cpu = make_measurer(Backend::Cpu, rec);
  CHECK(std::string(cpu->name()) == backend_name(Backend::Cpu));
  CHECK(&cpu->recording() == &rec);
  CHECK(cpu->concurrency() >= 1);
  CHECK(cpu->measures_regions());
  if (!cuda_backend_built()) {
    CHECK_THROWS_WITH_AS(make_measurer(Backend::Cuda, rec), doctest::Contains("built without CUDA"), Error);
    CHECK(backend_unsupported_reason(Backend::Cuda, Plan(2, 1, 32, 32), SimOptions{}) == "built without CUDA");
  }
  CHECK(backend_unsupported_reason(Backend::Cpu, Plan(2, 1, 32, 32), SimOptions{}).empty());
}

TEST_CASE("planning_backend: the optimal allocator's tables on cuda only when backend = \"cuda\"") {
  CHECK(planning_backend(BackendRequest::Cpu) == Backend::Cpu);
  // auto decides on the plans, which are not built yet: the tables are measured on the CPU.
  CHECK(planning_backend(BackendRequest::Auto) == Backend::Cpu);
  std::string why;
  if (cuda_device(&why).empty())
    CHECK_THROWS_WITH_AS(planning_backend(BackendRequest::Cuda), doctest::Contains("backend = \"cuda\": "), Error);
  else
    CHECK(planning_backend(BackendRequest::Cuda) == Backend::Cuda);
}

TEST_CASE("Measurers: one measurer per backend and recording, made on first use") {
  const Recording a = test::random_recording(2, 1, 32, 32, 5), b = test::random_recording(2, 1, 32, 32, 6);
  Measurers measurers;
  Measurer& on_a = measurers.of(Backend::Cpu, a);
  CHECK(&on_a.recording() == &a);
  CHECK(&measurers.of(Backend::Cpu, a) == &on_a);
  Measurer& on_b = measurers.of(Backend::Cpu, b);
  CHECK(&on_b != &on_a);
  CHECK(&on_b.recording() == &b);
  const MeasurerFor source = measurers.source(Backend::Cpu);
  CHECK(&source(a) == &on_a);
  CHECK(&source(b) == &on_b);
}

TEST_CASE("precision: fp32 or tf32, and tf32 only where the CUDA simulator may run") {
  CHECK(parse_matmul_precision("fp32", "precision") == MatmulPrecision::Fp32);
  CHECK(parse_matmul_precision("tf32", "precision") == MatmulPrecision::Tf32);
  CHECK(std::string(matmul_precision_name(MatmulPrecision::Tf32)) == "tf32");
  CHECK_THROWS_WITH_AS(parse_matmul_precision("bf16", "cfg.toml:3: precision"),
                       doctest::Contains("cfg.toml:3: precision: precision must be \"fp32\" or \"tf32\", got \"bf16\""),
                       ConfigError);
  CHECK_THROWS_WITH_AS(check_precision_backend(MatmulPrecision::Tf32, BackendRequest::Cpu, "--precision"),
                       doctest::Contains("--precision: precision = \"tf32\" is the CUDA backend's fast mode"),
                       ConfigError);
  CHECK_NOTHROW(check_precision_backend(MatmulPrecision::Tf32, BackendRequest::Auto, "precision"));
  CHECK_NOTHROW(check_precision_backend(MatmulPrecision::Fp32, BackendRequest::Cpu, "precision"));
  // The CPU measurer has no fast mode: a Measurers given tf32 still makes the CPU simulator.
  const Recording rec = test::random_recording(2, 1, 32, 32, 5);
  Measurers measurers(MatmulPrecision::Tf32);
  CHECK(std::string(measurers.of(Backend::Cpu, rec).name()) == "cpu");
}
