#include "common/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kforge {

namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

// Fields of /proc/self/stat after the command name (which may contain spaces): index 0 is the
// state (field 3 of proc(5)).
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  std::vector<std::string> out;
  if (close == std::string::npos) return out;
  std::istringstream rest(line.substr(close + 2));
  for (std::string f; rest >> f;) out.push_back(f);
  return out;
}

double Field(const std::vector<std::string>& fields, size_t proc5_number) {
  const size_t i = proc5_number - 3;
  return i < fields.size() ? std::stod(fields[i]) : 0;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double v = 0;
      in >> v;
      return v;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  const std::vector<std::string> stat = StatFields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Family("process_cpu_seconds_total", "User and system CPU time spent, seconds", MetricType::Counter,
                       (Field(stat, 14) + Field(stat, 15)) / ticks));
  out.push_back(Family("process_resident_memory_bytes", "Resident memory size, bytes", MetricType::Gauge,
                       Field(stat, 24) * page));
  out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size, bytes", MetricType::Gauge,
                       Field(stat, 23)));
  out.push_back(Family("process_start_time_seconds", "Start time of the process since the epoch, seconds",
                       MetricType::Gauge, BootTimeSeconds() + Field(stat, 22) / ticks));
  out.push_back(Family("process_threads", "Threads in the process", MetricType::Gauge, Field(stat, 20)));
  // The directory listing holds one descriptor of its own while it is read.
  out.push_back(Family("process_open_fds", "Open file descriptors", MetricType::Gauge, fds > 0 ? fds - 1 : 0));
  out.push_back(Family("process_max_fds", "Limit on open file descriptors", MetricType::Gauge,
                       static_cast<double>(nofile.rlim_cur)));
  return out;
}

}  // namespace kforge
