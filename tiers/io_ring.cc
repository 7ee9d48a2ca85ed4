#include "tiers/io_ring.h"

#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

AlignedBuffer::AlignedBuffer(uint64_t size) : size_((size + 4095) / 4096 * 4096) {
  data_.reset(static_cast<char*>(std::aligned_alloc(4096, size_ == 0 ? 4096 : size_)));
  if (data_ != nullptr) std::memset(data_.get(), 0, size_);
}

absl::StatusOr<std::unique_ptr<IoRing>> IoRing::Create(uint32_t depth) {
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

IoRing::~IoRing() { io_uring_queue_exit(ring_.get()); }

void IoRing::QueueRead(int fd, void* buffer, uint32_t size, uint64_t offset, uint64_t tag) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_read(sqe, fd, buffer, size, offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueReadv(int fd, const struct iovec* iovecs, uint32_t count, uint64_t offset,
                        uint64_t tag) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_readv(sqe, fd, iovecs, count, offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueWrite(int fd, const void* buffer, uint32_t size, uint64_t offset, uint64_t tag,
                        bool dsync) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_write(sqe, fd, buffer, size, offset);
  if (dsync) sqe->rw_flags = RWF_DSYNC;
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

void IoRing::QueueFdatasync(int fd, uint64_t tag) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
  io_uring_sqe_set_data64(sqe, tag);
  ++queued_;
}

absl::Status IoRing::Submit() {
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
  while (in_flight_ > 0) {
    absl::StatusOr<Completion> completion = WaitOne();
    if (!completion.ok()) return completion.status();
    completions->push_back(*completion);
  }
  return absl::OkStatus();
}

}  // namespace kvcache
