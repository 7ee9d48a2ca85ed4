#include "events/vllm_event_codec.h"

#include <msgpack.hpp>

#include "absl/time/time.h"

namespace kvcache {

std::string EncodeVllmBatch(const KvEvent& event) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_array(3);
  packer.pack_double(absl::ToDoubleSeconds(event.time - absl::UnixEpoch()));
  packer.pack_array(1);
  switch (event.kind) {
    case KvEventKind::kBlocksStored: {
      packer.pack_array(8);
      packer.pack(std::string("BlockStored"));
      packer.pack_array(static_cast<uint32_t>(event.blocks.size()));
      for (const StoredBlock& block : event.blocks) packer.pack_uint64(block.hash.lo);
      if (event.parent_hash.has_value()) {
        packer.pack_uint64(event.parent_hash->lo);
      } else {
        packer.pack_nil();
      }
      size_t num_tokens = 0;
      for (const StoredBlock& block : event.blocks) num_tokens += block.token_ids.size();
      packer.pack_array(static_cast<uint32_t>(num_tokens));
      for (const StoredBlock& block : event.blocks) {
        for (uint32_t token : block.token_ids) packer.pack_uint32(token);
      }
      packer.pack_uint32(event.block_size);
      packer.pack_nil();  // lora_id
      packer.pack(event.medium);
      packer.pack_nil();  // lora_name
      break;
    }
    case KvEventKind::kBlocksRemoved:
      packer.pack_array(3);
      packer.pack(std::string("BlockRemoved"));
      packer.pack_array(static_cast<uint32_t>(event.removed.size()));
      for (const Hash128& hash : event.removed) packer.pack_uint64(hash.lo);
      packer.pack(event.medium);
      break;
    case KvEventKind::kAllBlocksCleared:
      packer.pack_array(1);
      packer.pack(std::string("AllBlocksCleared"));
      break;
  }
  packer.pack_int(0);  // data-parallel rank: the daemon is one publisher
  return std::string(buffer.data(), buffer.size());
}

std::string EncodeSequenceFrame(uint64_t sequence) {
  std::string frame(8, '\0');
  for (int i = 7; i >= 0; --i) {
    frame[i] = static_cast<char>(sequence & 0xff);
    sequence >>= 8;
  }
  return frame;
}

}  // namespace kvcache
