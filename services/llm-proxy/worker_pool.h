#pragma once

#include "services/llm-proxy/layer.h"

// A fixed set of worker threads over a bounded queue. Submitting never blocks: when every thread
// is busy and the queue is full, TrySubmit refuses at once and the caller answers "busy". No
// thread outlives the pool: Stop() (and the destructor) let the queued tasks run, each able to see
// stopping() and end early, then join every thread.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kforge::llm {

class WorkerPool {
 public:
  struct Stats {
    int threads = 0;          // worker threads started (fixed for the pool's life)
    int running = 0;          // tasks running now
    int queued = 0;           // tasks waiting for a thread
    int peak_running = 0;     // the most tasks ever running at once
    int64_t rejected = 0;     // TrySubmit calls refused (full or stopping)
  };

  // `threads` >= 1 workers; at most `queue_capacity` >= 0 tasks wait beyond the running ones.
  WorkerPool(int threads, int queue_capacity);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; false (and the task is dropped) when the queue is full or the pool is stopping.
  [[nodiscard]] bool TrySubmit(std::function<void()> task);
  // Refuses new tasks from now on and makes stopping() true, so that running and queued tasks can
  // cut their work short; returns at once.
  void RequestStop();
  // RequestStop(), then waits for the queued and running tasks and joins the threads. Idempotent.
  void Stop();
  // Lock-free: tasks poll it in their loops.
  bool stopping() const { return stopping_flag_.load(std::memory_order_relaxed); }
  Stats stats() const;

 private:
  void Work();

  const int queue_capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::atomic<bool> stopping_flag_{false};  // stopping_, for readers that take no lock
  int running_ = 0;
  int peak_running_ = 0;
  int64_t rejected_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace kforge::llm
