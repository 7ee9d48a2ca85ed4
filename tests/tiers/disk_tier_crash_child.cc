// disk_tier_crash_child PATH SLOTS: stores test blocks 0, 1, 2, ... (tests/tiers/test_blocks.h)
// into a disk tier at PATH as fast as it can, retrying when the queue is full, and prints
// "durable N" each time the count of durable records grows (records 0..N-1 are durable: the
// queue is written in order; blocks already in the file, from an earlier run, count). After SLOTS
// blocks it prints "done" and waits to be killed. disk_tier_crash_test SIGKILLs it at a random
// point and checks what a reopen serves.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/tiers/test_blocks.h"
#include "tiers/disk_tier.h"

int main(int argc, char** argv) {
  using namespace kvcache;  // NOLINT: a test program
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PATH SLOTS\n", argv[0]);
    return 2;
  }
  const uint64_t slots = std::strtoull(argv[2], nullptr, 10);
  auto tier = DiskTier::Open(testing::TestTierOptions(argv[1], slots));
  if (!tier.ok()) {
    std::fprintf(stderr, "open: %s\n", tier.status().ToString().c_str());
    return 1;
  }
  std::printf("open\n");
  std::fflush(stdout);
  uint64_t reported = 0;
  uint64_t present = 0;  // stored by an earlier run: always a prefix 0..present-1
  auto report = [&] {
    const uint64_t durable = present + (*tier)->stats().stores_durable;
    if (durable == reported) return;
    reported = durable;
    std::printf("durable %llu\n", static_cast<unsigned long long>(durable));
    std::fflush(stdout);
  };
  for (uint64_t i = 0; i < slots; ++i) {
    const std::string bytes = testing::TestBytes(testing::TestHash(i));
    absl::Status status;
    while (absl::IsResourceExhausted(status = (*tier)->Store(testing::TestIdentity(i), bytes))) {
      report();
      std::this_thread::yield();
    }
    if (absl::IsAlreadyExists(status)) {
      ++present;
      continue;
    }
    if (!status.ok()) {
      std::fprintf(stderr, "store %llu: %s\n", static_cast<unsigned long long>(i),
                   status.ToString().c_str());
      return 1;
    }
    report();
  }
  (*tier)->Flush();
  report();
  std::printf("done\n");
  std::fflush(stdout);
  while (true) ::pause();
}
