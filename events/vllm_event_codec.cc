#include "events/vllm_event_codec.h"

#include <msgpack.hpp>

#include "absl/time/time.h"

namespace kvcache {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// A tagged struct's header: its tag and `fields` more values, positional or named.
void PackHeader(Packer& packer, VllmEventEncoding encoding, const char* tag, uint32_t fields) {
  if (encoding == VllmEventEncoding::kArray) {
    packer.pack_array(1 + fields);
  } else {
    packer.pack_map(1 + fields);
    packer.pack(std::string("type"));
  }
  packer.pack(std::string(tag));
}

void PackName(Packer& packer, VllmEventEncoding encoding, const char* name) {
  if (encoding == VllmEventEncoding::kMap) packer.pack(std::string(name));
}

// Block i's hash: a page's engine key as bytes, else a token block's low 64 bits.
void PackHash(Packer& packer, const Hash128& hash, const std::vector<std::string>& page_keys,
              size_t i) {
  if (!page_keys.empty() && !page_keys[i].empty()) {
    packer.pack_bin(static_cast<uint32_t>(page_keys[i].size()));
    packer.pack_bin_body(page_keys[i].data(), static_cast<uint32_t>(page_keys[i].size()));
  } else {
    packer.pack_uint64(hash.lo);
  }
}

}  // namespace

std::string EncodeVllmBatch(const KvEvent& event, VllmEventEncoding encoding) {
  msgpack::sbuffer buffer;
  Packer packer(buffer);
  packer.pack_array(3);
  packer.pack_double(absl::ToDoubleSeconds(event.time - absl::UnixEpoch()));
  packer.pack_array(1);
  switch (event.kind) {
    case KvEventKind::kBlocksStored: {
      PackHeader(packer, encoding, "BlockStored", 7);
      PackName(packer, encoding, "block_hashes");
      packer.pack_array(static_cast<uint32_t>(event.blocks.size()));
      for (size_t i = 0; i < event.blocks.size(); ++i) {
        PackHash(packer, event.blocks[i].hash, event.page_keys, i);
      }
      PackName(packer, encoding, "parent_block_hash");
      if (event.parent_hash.has_value()) {
        packer.pack_uint64(event.parent_hash->lo);
      } else {
        packer.pack_nil();
      }
      size_t num_tokens = 0;
      for (const StoredBlock& block : event.blocks) num_tokens += block.token_ids.size();
      PackName(packer, encoding, "token_ids");
      packer.pack_array(static_cast<uint32_t>(num_tokens));
      for (const StoredBlock& block : event.blocks) {
        for (uint32_t token : block.token_ids) packer.pack_uint32(token);
      }
      PackName(packer, encoding, "block_size");
      packer.pack_uint32(event.block_size);
      PackName(packer, encoding, "lora_id");
      packer.pack_nil();
      PackName(packer, encoding, "medium");
      packer.pack(event.medium);
      PackName(packer, encoding, "lora_name");
      packer.pack_nil();
      break;
    }
    case KvEventKind::kBlocksRemoved:
      PackHeader(packer, encoding, "BlockRemoved", 2);
      PackName(packer, encoding, "block_hashes");
      packer.pack_array(static_cast<uint32_t>(event.removed.size()));
      for (size_t i = 0; i < event.removed.size(); ++i) {
        PackHash(packer, event.removed[i], event.page_keys, i);
      }
      PackName(packer, encoding, "medium");
      packer.pack(event.medium);
      break;
    case KvEventKind::kAllBlocksCleared:
      PackHeader(packer, encoding, "AllBlocksCleared", 0);
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
