// Error messages' shared pieces (sim/core/error.h, sim/core/strings.h): the context an
// error gathers on its way up keeps its type, and the "did you mean" hint.
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "test_util.h"

using namespace kvb;

TEST_CASE("Error::add_context prefixes the message and a rethrow keeps the error's type") {
  const auto layered = [] {
    try {
      try {
        throw ConfigError("group size 48 does not divide head_dim 64");
      } catch (Error& e) {
        e.add_context("kv_head 1 K");
        throw;
      }
    } catch (Error& e) {
      e.add_context("layer 3");
      throw;
    }
  };
  CHECK_THROWS_WITH_AS(layered(), "layer 3: kv_head 1 K: group size 48 does not divide head_dim 64", ConfigError);
  Error plain("bad");
  plain.add_context("file.npy");
  CHECK(std::string(plain.what()) == "file.npy: bad");
  const std::runtime_error& base = plain;  // what() through the base class sees the context too
  CHECK(std::string(base.what()) == "file.npy: bad");
}

TEST_CASE("did_you_mean: the hint for a close name, nothing for a far one") {
  const std::vector<std::string> names = {"metrics", "data", "output"};
  CHECK(did_you_mean("metrcs", names) == " (did you mean 'metrics'?)");
  CHECK(did_you_mean("zzzzzzzz", names).empty());
  CHECK(did_you_mean("data", {}).empty());
}
