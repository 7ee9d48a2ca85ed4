// CudaQwen3NextModel in a build without CUDA (KVCACHE_WITH_CUDA off): it exists so that callers
// link either way; Create answers FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "model/cuda/qwen3_next_cuda.h"

namespace kvcache::worker {

struct CudaQwen3NextModel::Impl {};

absl::StatusOr<CudaQwen3NextModel> CudaQwen3NextModel::Create(const Qwen3NextModel&, int) {
  return NotBuiltWith("CUDA");
}

CudaQwen3NextModel::CudaQwen3NextModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaQwen3NextModel::~CudaQwen3NextModel() = default;
CudaQwen3NextModel::CudaQwen3NextModel(CudaQwen3NextModel&& other) noexcept = default;
CudaQwen3NextModel& CudaQwen3NextModel::operator=(CudaQwen3NextModel&& other) noexcept = default;

int CudaQwen3NextModel::device() const { return -1; }

absl::StatusOr<std::vector<float>> CudaQwen3NextModel::Forward(absl::Span<const uint32_t>, uint32_t,
                                                               const DevicePagedKv&,
                                                               DeviceLinearAttentionState&) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::worker
