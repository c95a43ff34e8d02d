// doctest main of the GPU test programs (tests/gpu/test_*.cpp).
//
// With a CUDA device every test runs. Without one (CI has nvcc but no GPU) only the
// test suite "no_device" runs (checks that need no device, such as the twin table
// against Format::supports), and the program then exits 77, which CTest reports as
// skipped: a GPU test never reads as passed on a machine that could not run it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kernels/device.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const kvb::cuda::DeviceInfo dev = kvb::cuda::device_info();
  if (!dev.available) {
    context.addFilter("test-suite", "no_device");
    const int rc = context.run();
    if (rc != 0 || context.shouldExit()) return rc;
    std::printf("%s: %s; the device tests are skipped (exit 77)\n", argv[0], dev.describe().c_str());
    return 77;
  }
  std::printf("%s: %s\n", argv[0], dev.describe().c_str());
  return context.run();
}
