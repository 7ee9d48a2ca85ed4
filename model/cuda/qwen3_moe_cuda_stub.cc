// CudaQwen3MoeModel in a build without CUDA (KVCACHE_WITH_CUDA off): it exists so that callers
// link either way; Create answers FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "model/cuda/qwen3_moe_cuda.h"

namespace kvcache::worker {

struct CudaQwen3MoeModel::Impl {};

absl::StatusOr<CudaQwen3MoeModel> CudaQwen3MoeModel::Create(const Qwen3MoeModel&, int) {
  return NotBuiltWith("CUDA");
}

CudaQwen3MoeModel::CudaQwen3MoeModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaQwen3MoeModel::~CudaQwen3MoeModel() = default;
CudaQwen3MoeModel::CudaQwen3MoeModel(CudaQwen3MoeModel&& other) noexcept = default;
CudaQwen3MoeModel& CudaQwen3MoeModel::operator=(CudaQwen3MoeModel&& other) noexcept = default;

int CudaQwen3MoeModel::device() const { return -1; }

absl::StatusOr<std::vector<float>> CudaQwen3MoeModel::Forward(absl::Span<const uint32_t>, uint32_t,
                                                              const DevicePagedKv&) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::worker
