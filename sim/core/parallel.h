// An OpenMP loop whose iterations may throw. An exception must not leave an OpenMP
// region (the program would terminate), so each iteration's exception is caught and,
// after the loop, the one of the lowest failing index is rethrown.
#pragma once
#include <cstdint>
#include <exception>
#include <vector>

namespace kvb {

// Runs body(i) for i = 0 .. n-1 in parallel (dynamic schedule, one index at a time).
// Every index runs even when others fail; then the exception of the lowest failing
// index is rethrown, so the error reported does not depend on thread timing.
template <class Body>
void parallel_for_rethrow(int64_t n, Body&& body) {
  std::vector<std::exception_ptr> failures(static_cast<size_t>(n > 0 ? n : 0));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
      failures[static_cast<size_t>(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& f : failures)
    if (f) std::rethrow_exception(f);
}

}  // namespace kvb
