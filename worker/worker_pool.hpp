// The threads that do the proxy's blocking work: a handler's ledger call
// (libpqxx) and its call of Stripe (libcurl). The HTTP server reads and
// writes every connection without them and hands each complete request to
// this pool, so a connection costs a thread only while its request is
// being decided, never while its client is slow.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace billguard::proxy {

class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads);
  // Finishes the jobs already running, drops the queued ones.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs job on one of the threads, in the order submitted.
  void Submit(std::function<void()> job);
  // Stops taking jobs and waits for the running ones.
  void Stop();

 private:
  void Work();

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace billguard::proxy
