#include "tiers/io_ring.h"

#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

AlignedBuffer::AlignedBuffer(uint64_t size) : size_((size + 4095) / 4096 * 4096) {
  data_.reset(static_cast<char*>(std::aligned_alloc(4096, size_ == 0 ? 4096 : size_)));
  if (data_ != nullptr) std::memset(data_.get(), 0, size_);
}

absl::string_view IoBackendName(IoBackend backend) {
  return backend == IoBackend::kIoUring ? "io_uring" : "system calls";
}

IoBackend IoRing::Probe(std::string* why_not_io_uring) {
  absl::StatusOr<std::unique_ptr<IoRing>> ring = Create(1, IoBackend::kIoUring);
  if (ring.ok()) return IoBackend::kIoUring;
  if (why_not_io_uring != nullptr) *why_not_io_uring = std::string(ring.status().message());
  return IoBackend::kSyscalls;
}

absl::StatusOr<std::unique_ptr<IoRing>> IoRing::Create(uint32_t depth, IoBackend backend) {
  if (backend == IoBackend::kSyscalls) return std::unique_ptr<IoRing>(new IoRing(depth, nullptr));
  auto ring = std::make_unique<::io_uring>();
  const int error = io_uring_queue_init(depth, ring.get(), 0);
  if (error < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("io_uring_queue_init(", depth, "): ", std::strerror(-error)));
  }
  return std::unique_ptr<IoRing>(new IoRing(depth, std::move(ring)));
}

IoRing::IoRing(uint32_t depth, std::unique_ptr<::io_uring> ring)
    : depth_(depth), ring_(std::move(ring)) {}

IoRing::~IoRing() {
  if (ring_ != nullptr) io_uring_queue_exit(ring_.get());
}

int IoRing::Perform(const Queued& op) {
  ssize_t result = 0;
  do {
    switch (op.kind) {
      case Queued::Kind::kRead:
        result = ::pread(op.fd, op.buffer, op.size, static_cast<off_t>(op.offset));
        break;
      case Queued::Kind::kReadv:
        result =
            ::preadv(op.fd, op.iovecs, static_cast<int>(op.size), static_cast<off_t>(op.offset));
        break;
      case Queued::Kind::kWrite: {
        const iovec one{op.buffer, op.size};
        result =
            ::pwritev2(op.fd, &one, 1, static_cast<off_t>(op.offset), op.dsync ? RWF_DSYNC : 0);
        break;
      }
      case Queued::Kind::kWritev:
        result = ::pwritev2(op.fd, op.iovecs, static_cast<int>(op.size),
                            static_cast<off_t>(op.offset), op.dsync ? RWF_DSYNC : 0);
        break;
      case Queued::Kind::kFdatasync:
        result = ::fdatasync(op.fd);
        break;
    }
  } while (result < 0 && errno == EINTR);
  // As io_uring reports it: bytes transferred, or -errno.
  return result < 0 ? -errno : static_cast<int>(result);
}

void IoRing::QueueRead(int fd, void* buffer, uint32_t size, uint64_t offset, uint64_t tag) {
  if (ring_ == nullptr) {
    pending_.push_back({Queued::Kind::kRead, fd, buffer, nullptr, size, offset, tag, false});
    ++queued_;
    return;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_read(sqe, fd, buffer, size, offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueReadv(int fd, const struct iovec* iovecs, uint32_t count, uint64_t offset,
                        uint64_t tag) {
  if (ring_ == nullptr) {
    pending_.push_back({Queued::Kind::kReadv, fd, nullptr, iovecs, count, offset, tag, false});
    ++queued_;
    return;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_readv(sqe, fd, iovecs, count, offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueWrite(int fd, const void* buffer, uint32_t size, uint64_t offset, uint64_t tag,
                        bool dsync) {
  if (ring_ == nullptr) {
    pending_.push_back(
        {Queued::Kind::kWrite, fd, const_cast<void*>(buffer), nullptr, size, offset, tag, dsync});
    ++queued_;
    return;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_write(sqe, fd, buffer, size, offset);
  if (dsync) sqe->rw_flags = RWF_DSYNC;
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueWritev(int fd, const struct iovec* iovecs, uint32_t count, uint64_t offset,
                         uint64_t tag, bool dsync) {
  if (ring_ == nullptr) {
    pending_.push_back({Queued::Kind::kWritev, fd, nullptr, iovecs, count, offset, tag, dsync});
    ++queued_;
    return;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_writev(sqe, fd, iovecs, count, offset);
  if (dsync) sqe->rw_flags = RWF_DSYNC;
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueFdatasync(int fd, uint64_t tag, bool after_earlier) {
  if (ring_ == nullptr) {
    pending_.push_back({Queued::Kind::kFdatasync, fd, nullptr, nullptr, 0, 0, tag, false});
    ++queued_;
    return;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
  // The system-call backend performs its queue in order, which is the same.
  if (after_earlier) sqe->flags |= IOSQE_IO_DRAIN;
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

absl::Status IoRing::Submit() {
  if (ring_ == nullptr) {
    // In order: a batch's fdatasync is queued after its writes, and runs after them here too.
    for (const Queued& op : pending_) done_.push_back(Completion{op.tag, Perform(op)});
    pending_.clear();
    in_flight_ += queued_;
    queued_ = 0;
    return absl::OkStatus();
  }
  int submitted = io_uring_submit(ring_.get());
  while (submitted == -EINTR) submitted = io_uring_submit(ring_.get());
  if (submitted < 0) {
    return absl::InternalError(absl::StrCat("io_uring_submit: ", std::strerror(-submitted)));
  }
  in_flight_ += queued_;
  queued_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<IoRing::Completion> IoRing::WaitOne() {
  if (ring_ == nullptr) {
    if (done_.empty()) return absl::InternalError("WaitOne with nothing in flight");
    const Completion completion = done_.front();
    done_.erase(done_.begin());
    --in_flight_;
    return completion;
  }
  io_uring_cqe* cqe = nullptr;
  int error = io_uring_wait_cqe(ring_.get(), &cqe);
  while (error == -EINTR) error = io_uring_wait_cqe(ring_.get(), &cqe);
  if (error < 0) {
    return absl::InternalError(absl::StrCat("io_uring_wait_cqe: ", std::strerror(-error)));
  }
  const Completion completion{io_uring_cqe_get_data64(cqe), cqe->res};
  io_uring_cqe_seen(ring_.get(), cqe);
  --in_flight_;
  return completion;
}

absl::Status IoRing::Wait(std::vector<Completion>* completions) {
  if (ring_ != nullptr && in_flight_ > 0) {
    // The kernel wakes this thread once all of them are done; then they are collected without
    // waiting.
    io_uring_cqe* cqe = nullptr;
    int error = io_uring_wait_cqe_nr(ring_.get(), &cqe, in_flight_);
    while (error == -EINTR) error = io_uring_wait_cqe_nr(ring_.get(), &cqe, in_flight_);
    if (error < 0) {
      return absl::InternalError(absl::StrCat("io_uring_wait_cqe_nr: ", std::strerror(-error)));
    }
    while (in_flight_ > 0 && io_uring_peek_cqe(ring_.get(), &cqe) == 0) {
      completions->push_back(Completion{io_uring_cqe_get_data64(cqe), cqe->res});
      io_uring_cqe_seen(ring_.get(), cqe);
      --in_flight_;
    }
  }
  while (in_flight_ > 0) {
    absl::StatusOr<Completion> completion = WaitOne();
    if (!completion.ok()) return completion.status();
    completions->push_back(*completion);
  }
  return absl::OkStatus();
}

}  // namespace kvcache
