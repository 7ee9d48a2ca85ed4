// The vLLM wire format, byte for byte where it matters to decoders: a 3-element envelope,
// positional events tagged by class name, hashes as msgpack uint64 even above INT64_MAX.
#include "events/vllm_event_codec.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>

#include "events/zmq_publisher.h"

namespace kvcache {
namespace {

msgpack::object_handle Decode(const std::string& payload) {
  return msgpack::unpack(payload.data(), payload.size());
}

TEST(VllmEventCodecTest, BlockStoredIsAPositionalTaggedArrayWithUint64Hashes) {
  KvEvent event;
  event.kind = KvEventKind::kBlocksStored;
  event.time = absl::FromUnixMillis(1789095808830);
  event.medium = "GPU";
  event.block_size = 2;
  event.parent_hash = Hash128{.hi = 1, .lo = 0xfffffffffffffff0ULL};  // above INT64_MAX
  event.blocks = {StoredBlock{.hash = {.hi = 9, .lo = 7}, .token_ids = {1, 2}},
                  StoredBlock{.hash = {.hi = 9, .lo = 8}, .token_ids = {3, 4}}};
  msgpack::object_handle handle = Decode(EncodeVllmBatch(event));
  const msgpack::object& batch = handle.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].via.f64, 1789095808.83);
  EXPECT_EQ(batch.via.array.ptr[2].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(batch.via.array.ptr[2].via.u64, 0u);
  const msgpack::object& events = batch.via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 1u);
  const msgpack::object& stored = events.via.array.ptr[0];
  ASSERT_EQ(stored.via.array.size, 8u);
  EXPECT_EQ(stored.via.array.ptr[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(stored.via.array.ptr[2].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(stored.via.array.ptr[2].via.u64, 0xfffffffffffffff0ULL);
  EXPECT_EQ(stored.via.array.ptr[3].as<std::vector<uint32_t>>(),
            (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(stored.via.array.ptr[4].as<uint32_t>(), 2u);
  EXPECT_TRUE(stored.via.array.ptr[5].is_nil());  // lora_id
  EXPECT_EQ(stored.via.array.ptr[6].as<std::string>(), "GPU");
  EXPECT_TRUE(stored.via.array.ptr[7].is_nil());  // lora_name
}

TEST(VllmEventCodecTest, AChainStartHasANilParentAndRemovalsAndClearsHaveTheirShapes) {
  KvEvent stored{.kind = KvEventKind::kBlocksStored, .medium = "CPU", .block_size = 1};
  stored.blocks = {StoredBlock{.hash = {.lo = 5}, .token_ids = {42}}};
  msgpack::object_handle handle = Decode(EncodeVllmBatch(stored));
  EXPECT_TRUE(handle.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[2].is_nil());

  KvEvent removed{.kind = KvEventKind::kBlocksRemoved, .medium = "CPU"};
  removed.removed = {Hash128{.lo = 5}, Hash128{.lo = ~0ULL}};
  handle = Decode(EncodeVllmBatch(removed));
  const msgpack::object& removal = handle.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(removal.via.array.size, 3u);
  EXPECT_EQ(removal.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removal.via.array.ptr[1].as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{5, ~0ULL}));
  EXPECT_EQ(removal.via.array.ptr[2].as<std::string>(), "CPU");

  handle = Decode(EncodeVllmBatch(KvEvent{.kind = KvEventKind::kAllBlocksCleared}));
  const msgpack::object& cleared = handle.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(cleared.via.array.size, 1u);
  EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
}

TEST(VllmEventCodecTest, SequenceFramesAreBigEndian) {
  EXPECT_EQ(EncodeSequenceFrame(0x0102030405060708ULL), std::string("\1\2\3\4\5\6\7\10", 8));
  EXPECT_EQ(EncodeSequenceFrame(0), std::string(8, '\0'));
}

TEST(ZmqEventPublisherTest, BindsOrConnectsAsVllmDoes) {
  EXPECT_TRUE(ZmqEventPublisher::Binds("tcp://*:5557"));
  EXPECT_TRUE(ZmqEventPublisher::Binds("tcp://[::]:5557"));
  EXPECT_TRUE(ZmqEventPublisher::Binds("ipc:///run/kvcache/events"));
  EXPECT_TRUE(ZmqEventPublisher::Binds("inproc://events"));
  EXPECT_FALSE(ZmqEventPublisher::Binds("tcp://router.llm-d.svc:5557"));
}

TEST(ZmqEventPublisherTest, AnEndpointZeroMqRejectsIsInvalidArgument) {
  KvEventLog log;
  absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> publisher =
      ZmqEventPublisher::Start(&log, {.endpoint = "nonsense://here", .topic = "kv@a@b"});
  ASSERT_FALSE(publisher.ok());
  EXPECT_EQ(publisher.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(publisher.status().message().find("nonsense://here"), std::string::npos);
  publisher = ZmqEventPublisher::Start(
      &log,
      {.endpoint = "inproc://ok", .replay_endpoint = "tcp://*:not-a-port", .topic = "kv@a@b"});
  ASSERT_FALSE(publisher.ok());
  EXPECT_EQ(publisher.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvcache
