// FaultInjectionPoolMemory: a PoolMemory that wraps a real one and, from a chosen operation on,
// fails like a device with a sticky error (in the spirit of LevelDB's FaultInjectionTestEnv):
// the Nth call of the chosen kind fails with the injected status, and so does every block
// operation after it, of any kind. It hands out no host pointers (HostBlock is null), as device
// memory does, so GetBlocks stages every byte through Read.
//
// Thread safety: as PoolMemory.
#ifndef KVCACHE_TESTS_TESTING_FAULT_INJECTION_POOL_MEMORY_H_
#define KVCACHE_TESTS_TESTING_FAULT_INJECTION_POOL_MEMORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cache/pool_memory.h"
#include "common/status_macros.h"

namespace kvcache::testing {

class FaultInjectionPoolMemory final : public PoolMemory {
 public:
  enum class Op { kCopyBlock, kWrite, kRead, kChecksum };

  // What a sticky CUDA fault looks like once the pool memory's CUDA helper has mapped it.
  static absl::Status StickyCudaError() {
    return absl::InternalError("copying a block: an illegal memory access was encountered");
  }

  explicit FaultInjectionPoolMemory(std::unique_ptr<PoolMemory> base)
      : PoolMemory(base->block_bytes(), base->num_blocks()), base_(std::move(base)) {}

  // The `n`th call (1-based, counted from now) of `op` fails with `fault`, and every block
  // operation after it.
  void FailNth(Op op, int n, absl::Status fault) {
    absl::MutexLock lock(&mu_);
    op_ = op;
    countdown_ = n;
    fault_ = std::move(fault);
  }
  // Runs `hook(src, dst)` at the start of every CopyBlock, before the copy: to act while a
  // caller is between its locks. REQUIRES: set before the memory is shared.
  void BeforeCopy(std::function<void(uint32_t src, uint32_t dst)> hook) {
    before_copy_ = std::move(hook);
  }
  // Block operations that reached this memory, failed ones included.
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  bool tripped() const {
    absl::MutexLock lock(&mu_);
    return tripped_;
  }

  std::string kind() const override { return base_->kind(); }
  MappingInfo mapping() const override { return base_->mapping(); }
  absl::Status CopyBlock(uint32_t src, uint32_t dst) override {
    if (before_copy_) before_copy_(src, dst);
    RETURN_IF_ERROR(Next(Op::kCopyBlock));
    return base_->CopyBlock(src, dst);
  }
  absl::Status Write(uint32_t block, uint64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(Next(Op::kWrite));
    return base_->Write(block, offset, bytes);
  }
  absl::Status Read(uint32_t block, uint64_t offset, uint64_t size, char* out) const override {
    RETURN_IF_ERROR(Next(Op::kRead));
    return base_->Read(block, offset, size, out);
  }
  absl::StatusOr<uint64_t> Checksum(uint32_t block) const override {
    RETURN_IF_ERROR(Next(Op::kChecksum));
    return base_->Checksum(block);
  }

 private:
  // The injected fault if `op` trips it or it has tripped already; OK otherwise.
  absl::Status Next(Op op) const {
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (!tripped_ && countdown_ > 0 && op == op_ && --countdown_ == 0) tripped_ = true;
    return tripped_ ? fault_ : absl::OkStatus();
  }

  const std::unique_ptr<PoolMemory> base_;
  std::function<void(uint32_t, uint32_t)> before_copy_;  // constant once shared

  mutable absl::Mutex mu_;
  mutable int calls_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int countdown_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no fault armed
  mutable bool tripped_ ABSL_GUARDED_BY(mu_) = false;
  Op op_ ABSL_GUARDED_BY(mu_) = Op::kCopyBlock;
  absl::Status fault_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_FAULT_INJECTION_POOL_MEMORY_H_
