#include "services/llm-proxy/worker_pool.h"

#include <algorithm>

namespace kforge::llm {

WorkerPool::WorkerPool(int threads, int queue_capacity) : queue_capacity_(std::max(0, queue_capacity)) {
  const int n = std::max(1, threads);
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::TrySubmit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Running tasks hold threads and the queue holds the waiting ones: together at most every
    // thread plus the queue's capacity.
    if (stopping_ || running_ + static_cast<int>(queue_.size()) >= static_cast<int>(threads_.size()) + queue_capacity_) {
      ++rejected_;
      return false;
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    stopping_flag_.store(true, std::memory_order_relaxed);
  }
  cv_.notify_all();
}

void WorkerPool::Stop() {
  RequestStop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

WorkerPool::Stats WorkerPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Stats{.threads = static_cast<int>(threads_.size()),
               .running = running_,
               .queued = static_cast<int>(queue_.size()),
               .peak_running = peak_running_,
               .rejected = rejected_};
}

void WorkerPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    // Stopping drains the queue first: every queued task owns a call that must be answered.
    if (queue_.empty()) return;
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    peak_running_ = std::max(peak_running_, running_);
    lock.unlock();
    task();
    task = nullptr;  // what the task holds goes now, not when the next one comes
    lock.lock();
    --running_;
  }
}

}  // namespace kforge::llm
