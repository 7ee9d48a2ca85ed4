#include "server/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/version.h"

namespace kvcache {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

absl::StatusOr<std::string> ReadText(const char* path) {
  std::ifstream file(path);
  if (!file) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// /proc/stat's "btime N": the boot time, seconds since the epoch.
absl::StatusOr<double> BootTime() {
  absl::StatusOr<std::string> text = ReadText("/proc/stat");
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    double seconds = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtod(line, &seconds)) return seconds;
  }
  return absl::UnavailableError("/proc/stat has no btime");
}

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the descriptor opendir itself holds
}

MetricFamily OneSample(std::string name, std::string help, double value, MetricType type) {
  ClientMetric metric;
  if (type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return MetricFamily{
      .name = std::move(name), .help = std::move(help), .type = type, .metric = {metric}};
}

}  // namespace

absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat, double ticks_per_second,
                                           double page_size, double boot_time_seconds) {
  const size_t name_end = stat.rfind(')');
  if (name_end == absl::string_view::npos || ticks_per_second <= 0) {
    return absl::InvalidArgumentError("not a /proc/PID/stat line");
  }
  // Field 3 (state) onwards; proc(5) numbers them from 1.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(name_end + 1), ' ', absl::SkipEmpty());
  auto field = [&](size_t number, double* value) {
    return number - 3 < fields.size() && absl::SimpleAtod(fields[number - 3], value);
  };
  double utime = 0, stime = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
  if (!field(14, &utime) || !field(15, &stime) || !field(22, &start_ticks) || !field(23, &vsize) ||
      !field(24, &rss_pages)) {
    return absl::InvalidArgumentError("a /proc/PID/stat line with too few fields");
  }
  ProcessStats stats;
  stats.cpu_seconds = (utime + stime) / ticks_per_second;
  stats.virtual_bytes = vsize;
  stats.resident_bytes = rss_pages * page_size;
  stats.start_time_seconds = boot_time_seconds + start_ticks / ticks_per_second;
  return stats;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  absl::StatusOr<std::string> stat = ReadText("/proc/self/stat");
  if (!stat.ok()) return stat.status();
  absl::StatusOr<double> boot_time = BootTime();
  if (!boot_time.ok()) return boot_time.status();
  absl::StatusOr<ProcessStats> stats =
      ParseProcStat(*stat, static_cast<double>(sysconf(_SC_CLK_TCK)),
                    static_cast<double>(sysconf(_SC_PAGESIZE)), *boot_time);
  if (!stats.ok()) return absl::UnavailableError(stats.status().message());
  stats->open_fds = OpenFds();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) stats->max_fds = static_cast<double>(limit.rlim_cur);
  return stats;
}

std::vector<MetricFamily> ProcessFamilies() {
  std::vector<MetricFamily> families;
  MetricFamily build = OneSample("kvcache_build_info",
                                 "The kvcache release and source revision this daemon was built "
                                 "from; always 1.",
                                 1, MetricType::Gauge);
  build.metric[0].label = {{"version", std::string(Version())},
                           {"revision", std::string(Revision())}};
  families.push_back(std::move(build));

  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  if (!stats.ok()) return families;
  const auto gauge = MetricType::Gauge;
  families.push_back(OneSample("process_cpu_seconds_total",
                               "Total user and system CPU time spent in "
                               "seconds.",
                               stats->cpu_seconds, MetricType::Counter));
  families.push_back(OneSample("process_resident_memory_bytes", "Resident memory size in bytes.",
                               stats->resident_bytes, gauge));
  families.push_back(OneSample("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                               stats->virtual_bytes, gauge));
  families.push_back(OneSample("process_start_time_seconds",
                               "Start time of the process since unix epoch in seconds.",
                               stats->start_time_seconds, gauge));
  families.push_back(
      OneSample("process_open_fds", "Number of open file descriptors.", stats->open_fds, gauge));
  families.push_back(OneSample("process_max_fds", "Maximum number of open file descriptors.",
                               stats->max_fds, gauge));
  return families;
}

}  // namespace kvcache
