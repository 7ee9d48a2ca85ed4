// The families every Prometheus client library exports beside a program's own, which dashboards
// and alerts expect of any target: kvcache_build_info (the version, common/version.h) and the
// process_* families of client_golang and client_python (CPU seconds, resident and virtual
// memory, start time, open and maximum file descriptors), read from /proc/self at each scrape.
//
// Thread safety: functions; each reads /proc afresh.
#ifndef KVCACHE_SERVER_PROCESS_METRICS_H_
#define KVCACHE_SERVER_PROCESS_METRICS_H_

#include <prometheus/metric_family.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system CPU time
  double resident_bytes = 0;      // resident set size
  double virtual_bytes = 0;       // virtual memory size
  double start_time_seconds = 0;  // start time, seconds since the Unix epoch
  double open_fds = 0;            // entries in /proc/self/fd
  double max_fds = 0;             // RLIMIT_NOFILE's soft limit
};

// The fields of /proc/PID/stat text that ProcessStats takes from it, converted with the clock
// tick rate, the page size and the boot time (/proc/stat's btime, seconds since the epoch); the
// other fields are left 0. INVALID_ARGUMENT for text that is not a stat line. The program's name
// in it may hold spaces and parentheses: fields are counted after its last ')'.
absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat, double ticks_per_second,
                                           double page_size, double boot_time_seconds);

// This process's figures; UNAVAILABLE where /proc cannot be read.
absl::StatusOr<ProcessStats> ReadProcessStats();

// kvcache_build_info{version, revision} 1, then the process_* families (left out when /proc
// cannot be read).
std::vector<prometheus::MetricFamily> ProcessFamilies();

}  // namespace kvcache

#endif  // KVCACHE_SERVER_PROCESS_METRICS_H_
