// BackgroundQueue (sim/core/background_queue.h): every submitted index runs once, in
// submission order, on a thread other than the submitter's, before drain() returns.
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "sim/core/background_queue.h"
#include "test_util.h"

TEST_CASE("BackgroundQueue runs every index once, in order, on its own thread") {
  for (size_t max_waiting : {size_t{1}, size_t{2}, size_t{5}}) {
    CAPTURE(max_waiting);
    std::mutex mu;
    std::vector<size_t> ran;
    std::atomic<int> on_submitter{0};
    const std::thread::id submitter = std::this_thread::get_id();
    kvb::BackgroundQueue queue(
        [&](size_t i) {
          if (std::this_thread::get_id() == submitter) ++on_submitter;
          std::lock_guard<std::mutex> lock(mu);
          ran.push_back(i);
        },
        max_waiting);
    for (size_t i = 0; i < 100; ++i) queue.submit(i);
    queue.drain();
    queue.drain();  // a second drain does nothing
    REQUIRE(ran.size() == 100);
    for (size_t i = 0; i < ran.size(); ++i) CHECK(ran[i] == i);
    CHECK(on_submitter == 0);
  }
}

TEST_CASE("BackgroundQueue's destructor runs what is queued") {
  std::atomic<size_t> sum{0};
  {
    kvb::BackgroundQueue queue([&](size_t i) { sum += i; });
    for (size_t i = 1; i <= 10; ++i) queue.submit(i);
  }
  CHECK(sum == 55);
  kvb::BackgroundQueue idle([](size_t) {});  // nothing submitted: drains at once
}
