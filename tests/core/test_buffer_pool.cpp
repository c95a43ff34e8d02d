// FloatBufferPool (sim/core/buffer_pool.h): a lease's buffer comes back to the pool when
// the lease ends and is handed out again; at most `keep` idle buffers are kept; leases
// taken at once never share a buffer. ScratchPool: objects given back are taken again.
#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sim/core/buffer_pool.h"
#include "test_util.h"

TEST_CASE("FloatBufferPool hands a returned buffer out again") {
  kvb::FloatBufferPool pool(1000);
  float* first = nullptr;
  {
    kvb::FloatBufferPool::Lease a = pool.take();
    first = a.data();
    REQUIRE(first != nullptr);
    std::fill(first, first + pool.floats(), 1.0f);  // the whole buffer is writable
  }
  kvb::FloatBufferPool::Lease again = pool.take();
  CHECK(again.data() == first);
  kvb::FloatBufferPool::Lease other = pool.take();  // the one idle buffer is out: a new one
  CHECK(other.data() != first);
}

TEST_CASE("FloatBufferPool keeps at most `keep` idle buffers, and a moved lease returns once") {
  kvb::FloatBufferPool pool(16, 2);
  std::set<float*> out;
  {
    std::vector<kvb::FloatBufferPool::Lease> leases;
    for (int i = 0; i < 4; ++i) leases.push_back(pool.take());  // moved into the vector
    for (const auto& l : leases) out.insert(l.data());
    CHECK(out.size() == 4);
  }
  // Two of the four came back; the next two takes reuse them, the third is new.
  kvb::FloatBufferPool::Lease a = pool.take(), b = pool.take(), c = pool.take();
  CHECK(out.count(a.data()) == 1);
  CHECK(out.count(b.data()) == 1);
  CHECK(a.data() != b.data());
  CHECK(c.data() != a.data());
  CHECK(c.data() != b.data());
}

TEST_CASE("FloatBufferPool: leases held at once on several threads never share a buffer") {
  kvb::FloatBufferPool pool(64, 3);
  std::mutex mu;
  std::vector<int> bad;
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        kvb::FloatBufferPool::Lease l = pool.take();
        float* p = l.data();
        std::fill(p, p + pool.floats(), static_cast<float>(t));
        std::this_thread::yield();
        if (std::any_of(p, p + pool.floats(), [t](float v) { return v != static_cast<float>(t); })) {
          std::lock_guard<std::mutex> lock(mu);
          bad.push_back(t);
        }
      }
    });
  for (std::thread& th : threads) th.join();
  CHECK(bad.empty());
}

TEST_CASE("ScratchPool: what is given back is taken again, memory and all, at most `keep` kept") {
  kvb::ScratchPool<std::vector<double>> pool(1);
  CHECK(pool.take().capacity() == 0);  // empty pool: a new one
  std::vector<double> a(1000, 1.0), b(10, 2.0);
  const double* memory = a.data();
  pool.give_back(std::move(a));
  pool.give_back(std::move(b));  // beyond keep: freed
  CHECK(pool.idle() == 1);
  std::vector<double> again = pool.take();
  CHECK(again.data() == memory);
  CHECK(again.capacity() >= 1000);
  CHECK(pool.idle() == 0);
}

TEST_CASE("ScratchPool::Lease: the object goes back when the scope ends, by a throw too") {
  kvb::ScratchPool<std::vector<double>> pool(2);
  const double* memory = nullptr;
  {
    kvb::ScratchPool<std::vector<double>>::Lease lease(pool);
    lease->assign(500, 3.0);
    memory = lease->data();
    CHECK(pool.idle() == 0);
  }
  REQUIRE(pool.idle() == 1);
  try {
    kvb::ScratchPool<std::vector<double>>::Lease lease(pool);
    CHECK((*lease).data() == memory);  // the one given back, memory and all
    throw std::runtime_error("a failing point");
  } catch (const std::runtime_error&) {
  }
  CHECK(pool.idle() == 1);
  CHECK(pool.take().data() == memory);
}
