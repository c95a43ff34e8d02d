// BackgroundQueue: runs a function on each submitted index on one worker thread of its
// own, in submission order, while the submitter goes on; at most `max_waiting` indices
// wait (submit blocks beyond that), which bounds what the waiting work holds.
// The sweep finalizes points this way while a device measures the next one
// (experiments/sweep.cpp).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace kvb {

class BackgroundQueue {
 public:
  // `run` must not throw (what it throws ends the program, as from any thread).
  BackgroundQueue(std::function<void(size_t)> run, size_t max_waiting = 2)
      : run_(std::move(run)), max_waiting_(max_waiting < 1 ? 1 : max_waiting), worker_([this] { work(); }) {}
  ~BackgroundQueue() { drain(); }
  BackgroundQueue(const BackgroundQueue&) = delete;
  BackgroundQueue& operator=(const BackgroundQueue&) = delete;

  // Queues i; waits while max_waiting indices are queued or running.
  void submit(size_t i) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return waiting_.size() < max_waiting_; });
    waiting_.push_back(i);
    changed_.notify_all();
  }
  // Runs what is queued, then stops the worker; later calls do nothing.
  void drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      changed_.notify_all();
    }
    worker_.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      changed_.wait(lock, [&] { return closing_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // closing, and nothing left
      const size_t i = waiting_.front();
      lock.unlock();
      run_(i);
      lock.lock();
      waiting_.pop_front();  // only now: submit() counts the running index as waiting
      changed_.notify_all();
    }
  }

  std::function<void(size_t)> run_;
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<size_t> waiting_;  // guarded by mu_; front = running or next
  bool closing_ = false;        // guarded by mu_
  std::thread worker_;          // last: starts once the members above exist
};

}  // namespace kvb
