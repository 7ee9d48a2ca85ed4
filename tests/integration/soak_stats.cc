#include "tests/integration/soak_stats.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvcache::testing {

void LatencyHistogram::Record(absl::Duration latency) {
  const double micros = std::max(1.0, absl::ToDoubleMicroseconds(latency));
  const int index = static_cast<int>(std::floor(std::log2(micros) * kBucketsPerOctave));
  ++buckets_[std::clamp(index, 0, kNumBuckets - 1)];
  ++count_;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (int i = 0; i < kNumBuckets; ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
}

double LatencyHistogram::PercentileMicros(double q) const {
  if (count_ == 0) return 0;
  // The rank of the quantile's sample, 1-based: the first bucket whose running count reaches it.
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (int i = 0; i < kNumBuckets; ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::exp2(static_cast<double>(i + 1) / kBucketsPerOctave);
  }
  return std::exp2(static_cast<double>(kNumBuckets) / kBucketsPerOctave);
}

std::string LatencyHistogram::ToString() const {
  std::string text;
  for (int i = 0; i < kNumBuckets; ++i) {
    if (buckets_[i] == 0) continue;
    absl::StrAppend(&text, text.empty() ? "" : ",", i, ":", buckets_[i]);
  }
  return text;
}

std::optional<LatencyHistogram> LatencyHistogram::Parse(absl::string_view text) {
  LatencyHistogram histogram;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(entry, ':');
    int index = 0;
    uint64_t count = 0;
    if (!absl::SimpleAtoi(parts.first, &index) || !absl::SimpleAtoi(parts.second, &count) ||
        index < 0 || index >= kNumBuckets) {
      return std::nullopt;
    }
    histogram.buckets_[index] += count;
    histogram.count_ += count;
  }
  return histogram;
}

void CallStats::Count(const absl::Status& status, absl::Duration latency) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      ++ok;
      this->latency.Record(latency);
      break;
    case absl::StatusCode::kResourceExhausted:
      ++exhausted;
      break;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      ++lost;
      break;
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnavailable:
      ++timeout;
      break;
    default:
      ++unexpected;
      break;
  }
}

void CallStats::Merge(const CallStats& other) {
  ok += other.ok;
  exhausted += other.exhausted;
  lost += other.lost;
  timeout += other.timeout;
  unexpected += other.unexpected;
  latency.Merge(other.latency);
}

void SoakStats::Merge(const SoakStats& other) {
  for (const auto& [name, call] : other.calls) calls[name].Merge(call);
  verified_blocks += other.verified_blocks;
  checksum_failures += other.checksum_failures;
  stale_reads += other.stale_reads;
  sessions += other.sessions;
}

uint64_t SoakStats::TotalOk() const {
  uint64_t total = 0;
  for (const auto& [name, call] : calls) total += call.ok;
  return total;
}

uint64_t SoakStats::TotalUnexpected() const {
  uint64_t total = 0;
  for (const auto& [name, call] : calls) total += call.unexpected;
  return total;
}

std::string SoakStats::ToLines() const {
  std::string lines;
  for (const auto& [name, call] : calls) {
    absl::StrAppend(&lines, "soak-call ", name, " ok=", call.ok, " exhausted=", call.exhausted,
                    " lost=", call.lost, " timeout=", call.timeout, " unexpected=", call.unexpected,
                    " hist=", call.latency.ToString(), "\n");
  }
  absl::StrAppend(&lines, "soak-counters verified_blocks=", verified_blocks,
                  " checksum_failures=", checksum_failures, " stale_reads=", stale_reads,
                  " sessions=", sessions, "\n");
  return lines;
}

namespace {

// "key=value" words after the line's prefix (and, for a call, its name).
std::map<std::string, std::string> Fields(absl::string_view rest) {
  std::map<std::string, std::string> fields;
  for (absl::string_view word : absl::StrSplit(rest, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
    fields[kv.first] = kv.second;
  }
  return fields;
}

bool Number(const std::map<std::string, std::string>& fields, const std::string& key,
            uint64_t* value) {
  auto it = fields.find(key);
  return it != fields.end() && absl::SimpleAtoi(it->second, value);
}

}  // namespace

bool SoakStats::ParseLine(absl::string_view line) {
  if (absl::ConsumePrefix(&line, "soak-call ")) {
    std::pair<absl::string_view, absl::string_view> name_rest =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::map<std::string, std::string> fields = Fields(name_rest.second);
    CallStats call;
    auto hist = fields.find("hist");
    if (name_rest.first.empty() || hist == fields.end()) return false;
    std::optional<LatencyHistogram> latency = LatencyHistogram::Parse(hist->second);
    if (!latency.has_value() || !Number(fields, "ok", &call.ok) ||
        !Number(fields, "exhausted", &call.exhausted) || !Number(fields, "lost", &call.lost) ||
        !Number(fields, "timeout", &call.timeout) ||
        !Number(fields, "unexpected", &call.unexpected) || latency->count() != call.ok) {
      return false;
    }
    call.latency = *latency;
    calls[std::string(name_rest.first)].Merge(call);
    return true;
  }
  if (absl::ConsumePrefix(&line, "soak-counters ")) {
    const std::map<std::string, std::string> fields = Fields(line);
    SoakStats counters;
    if (!Number(fields, "verified_blocks", &counters.verified_blocks) ||
        !Number(fields, "checksum_failures", &counters.checksum_failures) ||
        !Number(fields, "stale_reads", &counters.stale_reads) ||
        !Number(fields, "sessions", &counters.sessions)) {
      return false;
    }
    Merge(counters);
    return true;
  }
  return false;
}

}  // namespace kvcache::testing
