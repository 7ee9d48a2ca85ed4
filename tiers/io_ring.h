// IoRing: the io_uring calls the disk tier makes (liburing), reduced to "queue reads, writes and
// an fdatasync, submit, wait for all". Also AlignedBuffer, memory aligned for O_DIRECT. The disk
// tier and its bench (the raw-io_uring baseline) both use them.
//
// Where the kernel refuses io_uring — container runtimes' default seccomp profiles block its
// system calls (Docker since 25.0, containerd's RuntimeDefault), and kernels may disable it
// (kernel.io_uring_disabled) — the same interface runs on plain system calls
// (IoBackend::kSyscalls): Submit performs the queued operations one after another with
// pread/preadv/pwritev2/fdatasync, and the waits hand back their results. Slower (one operation
// in flight per ring), but the tier works.
//
// Thread safety: thread-compatible; one thread uses a ring at a time.
#ifndef KVCACHE_TIERS_IO_RING_H_
#define KVCACHE_TIERS_IO_RING_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct io_uring;  // liburing.h, kept out of this header
struct iovec;

namespace kvcache {

// `size` bytes aligned to 4096 (size rounded up to 4096), zeroed.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(uint64_t size);
  char* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  uint64_t size_;
  std::unique_ptr<char, Free> data_;
};

enum class IoBackend : uint8_t { kIoUring, kSyscalls };
absl::string_view IoBackendName(IoBackend backend);

class IoRing {
 public:
  // kIoUring: FAILED_PRECONDITION when the kernel refuses io_uring (disabled, seccomp), with
  // errno. kSyscalls always succeeds.
  static absl::StatusOr<std::unique_ptr<IoRing>> Create(uint32_t depth,
                                                        IoBackend backend = IoBackend::kIoUring);
  // The backend to use here: kIoUring if the kernel grants a ring, else kSyscalls (and why).
  static IoBackend Probe(std::string* why_not_io_uring = nullptr);
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  uint32_t depth() const { return depth_; }
  IoBackend backend() const {
    return ring_ == nullptr ? IoBackend::kSyscalls : IoBackend::kIoUring;
  }

  // Each Queue* adds one operation; REQUIRES: fewer than depth() queued since the last Submit.
  // `tag` comes back in its Completion.
  void QueueRead(int fd, void* buffer, uint32_t size, uint64_t offset, uint64_t tag);
  // Reads into `count` buffers in turn; `iovecs` must stay valid until the read completes.
  void QueueReadv(int fd, const struct iovec* iovecs, uint32_t count, uint64_t offset,
                  uint64_t tag);
  // dsync: RWF_DSYNC, durable when it completes.
  void QueueWrite(int fd, const void* buffer, uint32_t size, uint64_t offset, uint64_t tag,
                  bool dsync);
  // Writes `count` buffers in turn from `offset` (one request for the disk, not `count`);
  // `iovecs` must stay valid until the write completes.
  void QueueWritev(int fd, const struct iovec* iovecs, uint32_t count, uint64_t offset,
                   uint64_t tag, bool dsync);
  // after_earlier: it starts only once every operation submitted before it completed (a batch's
  // writes and their fdatasync in one submission, waited for once).
  void QueueFdatasync(int fd, uint64_t tag, bool after_earlier = false);

  struct Completion {
    uint64_t tag;
    int result;  // bytes transferred, or -errno
  };
  // Submits everything queued; it is in flight until Wait. INTERNAL when the kernel refuses.
  absl::Status Submit();
  // Waits until everything in flight completed (one wake-up, not one per operation), appending
  // one Completion per operation (in completion order) to `completions`. INTERNAL when waiting
  // fails (the ring is then unusable).
  absl::Status Wait(std::vector<Completion>* completions);
  // Waits for one operation in flight (REQUIRES: one is) and returns its Completion.
  absl::StatusOr<Completion> WaitOne();
  absl::Status SubmitAndWait(std::vector<Completion>* completions) {
    absl::Status status = Submit();
    return status.ok() ? Wait(completions) : status;
  }

 private:
  // An operation kept for Submit (kSyscalls).
  struct Queued {
    enum class Kind : uint8_t { kRead, kReadv, kWrite, kWritev, kFdatasync } kind;
    int fd = -1;
    void* buffer = nullptr;
    const struct iovec* iovecs = nullptr;
    uint32_t size = 0;  // bytes, or iovec count for kReadv and kWritev
    uint64_t offset = 0;
    uint64_t tag = 0;
    bool dsync = false;
  };

  IoRing(uint32_t depth, std::unique_ptr<::io_uring> ring);
  static int Perform(const Queued& op);

  const uint32_t depth_;
  std::unique_ptr<::io_uring> ring_;  // null: kSyscalls
  std::vector<Queued> pending_;       // kSyscalls: queued, not submitted
  std::vector<Completion> done_;      // kSyscalls: performed, not yet waited for
  uint32_t queued_ = 0;               // queued, not submitted
  uint32_t in_flight_ = 0;            // submitted, not yet waited for
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_IO_RING_H_
