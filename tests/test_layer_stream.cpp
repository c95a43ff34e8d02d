// StreamedRecording (sim/layer_stream.h): holding layers one at a time, and loading the
// next one on a thread of its own while the held one is worked on (prefetching).
#include <omp.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "recording_test_util.h"
#include "sim/layer_stream.h"
#include "test_util.h"

namespace kvb {
namespace {

// A streamed recording of test::random_layers' layers, whose loader copies them in and
// counts what it was asked: the order of the layers loaded, how many loads ran at once,
// the OpenMP thread count each saw; `fail_at` makes it throw for that layer.
struct CountingSource {
  Recording full;
  std::vector<int64_t> order;
  std::atomic<int> running{0}, most_running{0};
  std::vector<int> omp_threads;
  int64_t fail_at = -1;
  std::chrono::milliseconds delay{0};

  explicit CountingSource(int64_t layers) {
    test::RandomShape shape;
    shape.layers = layers;
    full = test::random_layers(shape);
  }
  Recording skeleton() const {
    Recording s = full;
    for (LayerTensors& l : s.layers) l = LayerTensors{};
    return s;
  }
  StreamedRecording::LayerLoader loader() {
    return [this](Recording& rec, int64_t l) {
      most_running = std::max(most_running.load(), ++running);
      order.push_back(l);
      omp_threads.push_back(omp_get_max_threads());
      std::this_thread::sleep_for(delay);
      --running;
      if (l == fail_at) throw std::runtime_error("layer " + std::to_string(l) + " is broken");
      rec.layers[static_cast<size_t>(l)] = full.layers[static_cast<size_t>(l)];
    };
  }
};

bool same_tensors(const LayerTensors& a, const LayerTensors& b) {
  return a.query.data == b.query.data && a.key.data == b.key.data && a.value.data == b.value.data;
}

TEST_CASE("prefetching gives the layers a plain pass gives, one load at a time, two layers held at most") {
  for (bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    CountingSource src(5);
    src.delay = std::chrono::milliseconds(5);
    StreamedRecording s(src.skeleton(), src.loader());
    {
      const PrefetchingLayers on(s, prefetch);
      for (int64_t l = 0; l < 5; ++l) {
        const HeldLayer held(s, l);
        CHECK(same_tensors(s.recording().layers[static_cast<size_t>(l)], src.full.layers[static_cast<size_t>(l)]));
        if (l > 0) CHECK(s.recording().layers[static_cast<size_t>(l - 1)].key.data.empty());
      }
    }
    CHECK(src.order == std::vector<int64_t>{0, 1, 2, 3, 4});
    CHECK(s.loads() == 5);
    CHECK(src.most_running == 1);
    CHECK(s.max_layers_held() == (prefetch ? 2 : 1));
    CHECK(s.layers_held() == 0);
    for (const LayerTensors& l : s.recording().layers) CHECK(l.key.data.empty());
  }
}

TEST_CASE("a prefetch loads with one OpenMP thread fewer than the caller's, at least one") {
  CountingSource src(3);
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  {
    StreamedRecording s(src.skeleton(), src.loader());
    const PrefetchingLayers on(s, true);
    for (int64_t l = 0; l < 3; ++l) const HeldLayer held(s, l);
  }
  omp_set_num_threads(1);
  {
    StreamedRecording s(src.skeleton(), src.loader());
    const PrefetchingLayers on(s, true);
    for (int64_t l = 0; l < 3; ++l) const HeldLayer held(s, l);
  }
  omp_set_num_threads(before);
  // Layer 0 is loaded by the caller, the others prefetched.
  CHECK(src.omp_threads == std::vector<int>{3, 2, 2, 1, 1, 1});
}

TEST_CASE("a prefetch's error surfaces when its layer is held, not before") {
  CountingSource src(4);
  src.fail_at = 2;
  StreamedRecording s(src.skeleton(), src.loader());
  {
    const PrefetchingLayers on(s, true);
    { const HeldLayer held(s, 0); }
    { const HeldLayer held(s, 1); }  // layer 2 failed meanwhile: not reported yet
    CHECK_THROWS_WITH_AS(s.hold(2), "layer 2 is broken", std::runtime_error);
    CHECK(s.layers_held() == 0);
    src.fail_at = -1;
    { const HeldLayer held(s, 2); }  // loaded again, synchronously; prefetches 3
    CHECK(s.recording().layers[2].key.data.empty());
  }  // the prefetch of 3 waited for and dropped
  CHECK(s.layers_held() == 0);
  CHECK(src.order == std::vector<int64_t>{0, 1, 2, 2, 3});
}

TEST_CASE("holding another layer than the prefetched one drops the prefetch") {
  CountingSource src(4);
  StreamedRecording s(src.skeleton(), src.loader());
  const PrefetchingLayers on(s, true);
  { const HeldLayer held(s, 0); }  // prefetches 1
  {
    const HeldLayer held(s, 3);  // 1 dropped; nothing after 3
    CHECK(same_tensors(s.recording().layers[3], src.full.layers[3]));
    CHECK(s.layers_held() == 1);
  }
  CHECK(src.order == std::vector<int64_t>{0, 1, 3});
  CHECK(s.layers_held() == 0);
}

TEST_CASE("turning prefetching on while a layer is held keeps that layer; the object ends with a prefetch under way") {
  CountingSource src(3);
  src.delay = std::chrono::milliseconds(20);
  auto s = std::make_unique<StreamedRecording>(src.skeleton(), src.loader());
  s->hold(0);
  s->set_prefetch(true);
  CHECK(same_tensors(s->recording().layers[0], src.full.layers[0]));
  s->release(0);
  s->hold(1);  // starts loading 2
  s.reset();   // waits for it
  CHECK(src.order == std::vector<int64_t>{0, 1, 2});
}

TEST_CASE("the loaded hook runs on the caller's thread, in order, with the layer in the recording") {
  for (bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    CountingSource src(4);
    std::vector<int64_t> seen;
    bool all_on_caller = true, all_present = true;
    const std::thread::id caller = std::this_thread::get_id();
    StreamedRecording s(src.skeleton(), src.loader(), [&](Recording& rec, int64_t l) {
      seen.push_back(l);
      all_on_caller = all_on_caller && std::this_thread::get_id() == caller;
      all_present = all_present && same_tensors(rec.layers[static_cast<size_t>(l)], src.full.layers[static_cast<size_t>(l)]);
    });
    {
      const PrefetchingLayers on(s, prefetch);
      for (int64_t l = 0; l < 4; ++l) const HeldLayer held(s, l);
    }
    CHECK(seen == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(all_on_caller);
    CHECK(all_present);
  }
}

TEST_CASE("a layer whose loaded hook throws is not held") {
  CountingSource src(3);
  StreamedRecording s(src.skeleton(), src.loader(), [](Recording&, int64_t l) {
    if (l == 1) throw std::runtime_error("layer 1 is not finite");
  });
  const PrefetchingLayers on(s, true);
  { const HeldLayer held(s, 0); }
  CHECK_THROWS_WITH_AS(s.hold(1), "layer 1 is not finite", std::runtime_error);
  CHECK(s.layers_held() == 0);
  CHECK(s.recording().layers[1].key.data.empty());
}

}  // namespace
}  // namespace kvb
