#include "worker/hybrid_pages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/cuda/device_kv_pool.h"
#include "model/paged_kv.h"

namespace kvcache::worker {
namespace {

const PagePartLayout* FindPart(absl::Span<const PagePartLayout> parts, absl::string_view name,
                               uint32_t* index) {
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].name == name) {
      *index = static_cast<uint32_t>(i);
      return &parts[i];
    }
  }
  return nullptr;
}

}  // namespace

std::string HybridPoolGeometry::SpecFields() const {
  return absl::StrCat(":layers=", pool_layout.num_layers, ":kv_heads=", pool_layout.num_kv_heads,
                      ":head_dim=", pool_layout.head_dim, ":block_size=", pool_layout.block_size,
                      ":dtype=", DTypeName(pool_layout.dtype), ":parts=", parts);
}

HybridPoolGeometry HybridPoolGeometryFor(const Qwen3NextConfig& config, uint32_t block_size,
                                         DType kv_dtype) {
  HybridPoolGeometry geometry;
  const PoolLayout kv_layout = HybridKvLayout(config, block_size, kv_dtype);
  geometry.kv_layout = kv_layout;
  geometry.kv_bytes = kv_layout.BlockBytes();
  geometry.state_bytes = LinearAttentionState::StateBytes(config);
  PoolLayout one_layer = kv_layout;
  one_layer.num_layers = 1;
  const uint64_t layer_block = one_layer.BlockBytes();
  const uint64_t state_layers = (geometry.state_bytes + layer_block - 1) / layer_block;
  geometry.state_part_bytes = state_layers * layer_block;
  geometry.pool_layout = kv_layout;
  geometry.pool_layout.num_layers = kv_layout.num_layers + static_cast<uint32_t>(state_layers);
  geometry.parts =
      absl::StrCat("kv/", geometry.kv_bytes, "+state/", geometry.state_part_bytes, "/trailing1");
  return geometry;
}

absl::StatusOr<HybridPages> HybridPagesIn(const Qwen3NextConfig& config, absl::string_view pool,
                                          const PoolLayout& layout, uint64_t block_bytes,
                                          absl::Span<const PagePartLayout> parts) {
  const PoolLayout kv_layout = HybridKvLayout(config, layout.block_size, layout.dtype);
  const uint64_t state_bytes = LinearAttentionState::StateBytes(config);
  const std::string wanted =
      HybridPoolGeometryFor(config, layout.block_size, layout.dtype).SpecFields();
  auto mismatch = [&](absl::string_view what) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool '", pool, "' does not hold the hybrid model's pages: ", what,
                     "; declare it as '", pool, wanted, "'"));
  };
  if (layout.num_kv_heads != kv_layout.num_kv_heads || layout.head_dim != kv_layout.head_dim) {
    return mismatch(absl::StrCat("it has ", layout.num_kv_heads, " KV heads of dim ",
                                 layout.head_dim, ", the model ", kv_layout.num_kv_heads, " of ",
                                 kv_layout.head_dim));
  }
  uint32_t kv_index = 0, state_index = 0;
  const PagePartLayout* kv = FindPart(parts, "kv", &kv_index);
  const PagePartLayout* state = FindPart(parts, "state", &state_index);
  if (kv == nullptr || kv->offset != 0 || kv->bytes != kv_layout.BlockBytes() ||
      kv->policy != PartHitPolicy::kAllPages) {
    return mismatch(absl::StrCat("its pages need a first, all-pages part \"kv\" of ",
                                 kv_layout.BlockBytes(), " bytes"));
  }
  if (state == nullptr || state->bytes < state_bytes ||
      state->policy != PartHitPolicy::kTrailingPages || state->trailing_pages != 1) {
    return mismatch(absl::StrCat("its pages need a part \"state\" of at least ", state_bytes,
                                 " bytes, trailing1"));
  }
  if (parts.size() != 2) return mismatch("its pages have parts other than kv and state");
  return HybridPages{.kv_layout = kv_layout,
                     .page_bytes = block_bytes,
                     .state_offset = state->offset,
                     .state_bytes = state_bytes,
                     .kv_mask = uint32_t{1} << kv_index,
                     .state_mask = uint32_t{1} << state_index};
}

HybridPages HybridPagesOf(const HybridPoolGeometry& geometry) {
  return HybridPages{.kv_layout = geometry.kv_layout,
                     .page_bytes = geometry.pool_layout.BlockBytes(),
                     .state_offset = geometry.kv_bytes,
                     .state_bytes = geometry.state_bytes,
                     .kv_mask = 1,
                     .state_mask = 2};
}

PoolForward HybridHostPoolForward(const Qwen3NextModel& model, uint8_t* pool_base,
                                  const HybridPages& pages, uint64_t num_pool_blocks,
                                  uint32_t checkpoint_pages, LinearAttentionState* state) {
  return [&model, pool_base, pages, num_pool_blocks, checkpoint_pages, state](
             absl::Span<const uint32_t> tokens, uint32_t start_position,
             absl::Span<const uint32_t> block_table) -> absl::StatusOr<std::vector<float>> {
    PagedKv kv(pool_base, pages.kv_layout, block_table, num_pool_blocks, pages.page_bytes);
    if (checkpoint_pages == 0) return model.Forward(tokens, start_position, kv, *state);
    const uint32_t block_size = pages.kv_layout.block_size;
    return model.ForwardWithCheckpoints(
        tokens, start_position, kv, *state, checkpoint_pages * block_size,
        [&](const LinearAttentionState& at_boundary) {
          // Forward checked the table covers every position it ran, this page's last included.
          const uint32_t page = block_table[at_boundary.position() / block_size - 1];
          return at_boundary.SaveTo(
              absl::MakeSpan(pool_base + uint64_t{page} * pages.page_bytes + pages.state_offset,
                             pages.state_bytes));
        });
  };
}

PoolForward HybridDevicePoolForward(CudaQwen3NextModel& model, uint8_t* pool_base,
                                    const HybridPages& pages, uint64_t num_pool_blocks,
                                    uint32_t checkpoint_pages, DeviceLinearAttentionState* state) {
  return [&model, pool_base, pages, num_pool_blocks, checkpoint_pages, state](
             absl::Span<const uint32_t> tokens, uint32_t start_position,
             absl::Span<const uint32_t> block_table) -> absl::StatusOr<std::vector<float>> {
    const DevicePagedKv kv{.pool_base = pool_base,
                           .layout = pages.kv_layout,
                           .block_table = block_table,
                           .num_pool_blocks = num_pool_blocks,
                           .page_stride_bytes = pages.page_bytes};
    if (checkpoint_pages == 0) return model.Forward(tokens, start_position, kv, *state);
    const uint64_t interval = uint64_t{checkpoint_pages} * pages.kv_layout.block_size;
    const uint64_t end = uint64_t{start_position} + tokens.size();
    uint64_t position = start_position;
    std::vector<float> logits;
    // Chunks ending at each checkpoint inside (start, end], then the rest; an empty call still
    // reaches Forward for its checks and codes.
    do {
      const uint64_t checkpoint = (position / interval + 1) * interval;
      const uint64_t chunk_end = std::min(end, checkpoint);
      ASSIGN_OR_RETURN(
          logits, model.Forward(tokens.subspan(position - start_position, chunk_end - position),
                                static_cast<uint32_t>(position), kv, *state));
      position = chunk_end;
      if (position == checkpoint) {
        // Forward checked that the table covers every position it ran, this page's last included.
        const uint32_t page = block_table[position / pages.kv_layout.block_size - 1];
        RETURN_IF_ERROR(state->SaveToDevice(
            pool_base + uint64_t{page} * pages.page_bytes + pages.state_offset, nullptr));
      }
    } while (position < end);
    return logits;
  };
}

namespace {

// OK when a state may be restored after `position` tokens: at a page end.
absl::Status CheckRestorePosition(const HybridPages& pages, uint32_t position) {
  if (position % pages.kv_layout.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a state restores at a page end; ", position,
                                                   " is inside a page of ",
                                                   pages.kv_layout.block_size, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreHybridState(const HybridPages& pages, const uint8_t* page, uint32_t position,
                                LinearAttentionState& state) {
  if (position == 0) {
    state.Reset();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckRestorePosition(pages, position));
  return state.RestoreFrom(absl::MakeConstSpan(page + pages.state_offset, pages.state_bytes),
                           position);
}

absl::Status RestoreHybridStateOnDevice(const HybridPages& pages, const uint8_t* device_page,
                                        uint32_t position, DeviceLinearAttentionState& state) {
  if (position == 0) return state.Reset(nullptr);
  RETURN_IF_ERROR(CheckRestorePosition(pages, position));
  return state.RestoreFromDevice(device_page + pages.state_offset, position, nullptr);
}

absl::StatusOr<GenerationResult> GenerateColdHybrid(const Qwen3NextModel& model,
                                                    absl::Span<const uint32_t> prompt,
                                                    uint32_t max_new_tokens, Sampler& sampler,
                                                    uint32_t block_size, DType dtype) {
  const HybridPages pages = HybridPagesOf(HybridPoolGeometryFor(model.config(), block_size, dtype));
  RETURN_IF_ERROR(pages.kv_layout.Validate());
  const std::vector<uint32_t> table = PrivateBlockTable(prompt.size(), max_new_tokens, block_size);
  std::vector<uint8_t> pool(table.size() * pages.page_bytes);
  LinearAttentionState state = model.NewState();
  return GenerateOver(HybridHostPoolForward(model, pool.data(), pages, table.size(),
                                            /*checkpoint_pages=*/0, &state),
                      block_size, table, prompt, max_new_tokens, sampler);
}

absl::StatusOr<GenerationResult> GenerateColdHybridCuda(CudaQwen3NextModel& model,
                                                        const Qwen3NextConfig& config,
                                                        absl::Span<const uint32_t> prompt,
                                                        uint32_t max_new_tokens, Sampler& sampler,
                                                        uint32_t block_size, DType dtype) {
  const HybridPoolGeometry geometry = HybridPoolGeometryFor(config, block_size, dtype);
  const HybridPages pages = HybridPagesOf(geometry);
  RETURN_IF_ERROR(pages.kv_layout.Validate());
  const std::vector<uint32_t> table = PrivateBlockTable(prompt.size(), max_new_tokens, block_size);
  ASSIGN_OR_RETURN(DeviceKvPool pool, DeviceKvPool::Create(model.device(), geometry.pool_layout,
                                                           static_cast<uint32_t>(table.size())));
  ASSIGN_OR_RETURN(DeviceLinearAttentionState state,
                   DeviceLinearAttentionState::Create(model.device(), config));
  // Every Forward synchronized its stream before returning, so pool and state are idle when freed.
  return GenerateOver(HybridDevicePoolForward(model, pool.base(), pages, pool.num_blocks(),
                                              /*checkpoint_pages=*/0, &state),
                      block_size, table, prompt, max_new_tokens, sampler);
}

}  // namespace kvcache::worker
