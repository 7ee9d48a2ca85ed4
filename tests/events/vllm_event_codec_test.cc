// The vLLM wire format, byte for byte where it matters to decoders: a 3-element envelope,
// events tagged by class name (positional arrays or tagged maps), hashes as msgpack uint64 even
// above INT64_MAX; and the publisher's replay socket as vLLM's subscribers reach it.
#include "events/vllm_event_codec.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <msgpack.hpp>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

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

// A page is named by the engine's key, as vLLM's bytes-form block hash: its consumers (llm-d's
// getHashAsUint64, Dynamo's BlockHashValue) reduce bytes to their last 8 big-endian, as vLLM's
// own int form does, so the key matches the engine's event for it in either form.
TEST(VllmEventCodecTest, APageIsNamedByItsEngineKeyAsBytesWithNoParentOrTokens) {
  const std::string key("\x01\x02\x00\x03 engine key", 16);
  KvEvent stored{.kind = KvEventKind::kBlocksStored, .medium = "CPU_PINNED", .block_size = 16};
  stored.blocks = {StoredBlock{.hash = {.hi = 1, .lo = 5}}};
  stored.page_keys = {key};
  stored.manifest_digest = "0123456789abcdef0123456789abcdef";
  for (VllmEventEncoding encoding : {VllmEventEncoding::kArray, VllmEventEncoding::kMap}) {
    msgpack::object_handle handle = Decode(EncodeVllmBatch(stored, encoding));
    const msgpack::object& event = handle.get().via.array.ptr[1].via.array.ptr[0];
    std::map<std::string, msgpack::object> fields;
    if (encoding == VllmEventEncoding::kArray) {
      ASSERT_EQ(event.via.array.size, 8u);
      fields = {{"block_hashes", event.via.array.ptr[1]},
                {"parent_block_hash", event.via.array.ptr[2]},
                {"token_ids", event.via.array.ptr[3]},
                {"medium", event.via.array.ptr[6]}};
    } else {
      fields = event.as<std::map<std::string, msgpack::object>>();
    }
    const msgpack::object& hashes = fields.at("block_hashes");
    ASSERT_EQ(hashes.via.array.size, 1u);
    ASSERT_EQ(hashes.via.array.ptr[0].type, msgpack::type::BIN);
    EXPECT_EQ(
        std::string(hashes.via.array.ptr[0].via.bin.ptr, hashes.via.array.ptr[0].via.bin.size),
        key);
    EXPECT_TRUE(fields.at("parent_block_hash").is_nil());
    EXPECT_EQ(fields.at("token_ids").via.array.size, 0u);
    EXPECT_EQ(fields.at("medium").as<std::string>(), "CPU_PINNED");
  }

  // A removal names a page by its key and a token block among it by its uint64.
  KvEvent removed{.kind = KvEventKind::kBlocksRemoved, .medium = "CPU"};
  removed.removed = {Hash128{.lo = 7}, Hash128{.lo = 5}};
  removed.page_keys = {"", key};
  msgpack::object_handle handle = Decode(EncodeVllmBatch(removed));
  const msgpack::object& hashes = handle.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[1];
  ASSERT_EQ(hashes.via.array.size, 2u);
  ASSERT_EQ(hashes.via.array.ptr[0].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(hashes.via.array.ptr[0].via.u64, 7u);
  ASSERT_EQ(hashes.via.array.ptr[1].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hashes.via.array.ptr[1].via.bin.ptr, hashes.via.array.ptr[1].via.bin.size),
            key);
}

// Current vLLM's KVCacheEvent is a msgspec struct with tag=True and no array_like: a map with
// the class name under "type", then its fields by name (defaults omitted).
TEST(VllmEventCodecTest, TheMapEncodingIsATaggedMapWithVllmsFieldNames) {
  KvEvent stored{.kind = KvEventKind::kBlocksStored, .medium = "CPU", .block_size = 1};
  stored.parent_hash = Hash128{.lo = 0xfffffffffffffff0ULL};
  stored.blocks = {StoredBlock{.hash = {.lo = 5}, .token_ids = {42}}};
  msgpack::object_handle handle = Decode(EncodeVllmBatch(stored, VllmEventEncoding::kMap));
  ASSERT_EQ(handle.get().type, msgpack::type::ARRAY);  // the batch stays [ts, events, rank]
  ASSERT_EQ(handle.get().via.array.size, 3u);
  const msgpack::object& event = handle.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(event.type, msgpack::type::MAP);
  std::vector<std::string> keys;
  std::map<std::string, msgpack::object> fields;
  for (uint32_t i = 0; i < event.via.map.size; ++i) {
    keys.push_back(event.via.map.ptr[i].key.as<std::string>());
    fields[keys.back()] = event.via.map.ptr[i].val;
  }
  EXPECT_EQ(keys,
            (std::vector<std::string>{"type", "block_hashes", "parent_block_hash", "token_ids",
                                      "block_size", "lora_id", "medium", "lora_name"}));
  EXPECT_EQ(fields["type"].as<std::string>(), "BlockStored");
  EXPECT_EQ(fields["block_hashes"].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{5}));
  EXPECT_EQ(fields["parent_block_hash"].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(fields["parent_block_hash"].via.u64, 0xfffffffffffffff0ULL);
  EXPECT_EQ(fields["token_ids"].as<std::vector<uint32_t>>(), (std::vector<uint32_t>{42}));
  EXPECT_EQ(fields["block_size"].as<uint32_t>(), 1u);
  EXPECT_TRUE(fields["lora_id"].is_nil());
  EXPECT_EQ(fields["medium"].as<std::string>(), "CPU");
  EXPECT_TRUE(fields["lora_name"].is_nil());

  KvEvent removed{.kind = KvEventKind::kBlocksRemoved, .medium = "DISK"};
  removed.removed = {Hash128{.lo = 5}};
  handle = Decode(EncodeVllmBatch(removed, VllmEventEncoding::kMap));
  const msgpack::object& removal = handle.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(removal.type, msgpack::type::MAP);
  ASSERT_EQ(removal.via.map.size, 3u);
  EXPECT_EQ(removal.via.map.ptr[0].key.as<std::string>(), "type");
  EXPECT_EQ(removal.via.map.ptr[0].val.as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removal.via.map.ptr[1].key.as<std::string>(), "block_hashes");
  EXPECT_EQ(removal.via.map.ptr[2].key.as<std::string>(), "medium");
  EXPECT_EQ(removal.via.map.ptr[2].val.as<std::string>(), "DISK");

  handle = Decode(
      EncodeVllmBatch(KvEvent{.kind = KvEventKind::kAllBlocksCleared}, VllmEventEncoding::kMap));
  const msgpack::object& cleared = handle.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(cleared.type, msgpack::type::MAP);
  ASSERT_EQ(cleared.via.map.size, 1u);
  EXPECT_EQ(cleared.via.map.ptr[0].val.as<std::string>(), "AllBlocksCleared");
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

// A loopback TCP endpoint nothing listens on now (the kernel picks the port, then lets it go).
std::string FreeLoopbackEndpoint() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return "tcp://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
}

// What a subscriber gets for a replay request from `start`, after its DEALER's empty frame.
std::vector<std::vector<std::string>> Replay(zmq::context_t& context, const std::string& endpoint,
                                             uint64_t start) {
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  dealer.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(EncodeSequenceFrame(start)), zmq::send_flags::none);
  std::vector<std::vector<std::string>> replies;
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  // A liveness bound, not a timing check: no answer at all is the failure.
  while (zmq::poll(&item, 1, std::chrono::seconds(30)) > 0) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(dealer, std::back_inserter(frames))) break;
    std::vector<std::string> strings;
    for (const zmq::message_t& frame : frames) strings.push_back(frame.to_string());
    replies.push_back(strings);
    if (strings.size() >= 3 && strings[strings.size() - 2] == std::string(8, '\xff')) break;
  }
  return replies;
}

// vLLM binds its replay ROUTER whatever the endpoint (subscribers connect a DEALER to it), so
// tcp://127.0.0.1:PORT must be bound too, not connected as the PUB rule would have it.
TEST(ZmqEventPublisherTest, TheReplayEndpointIsAlwaysBoundAndAnswersInEitherLayout) {
  for (ZmqReplayLayout layout : {ZmqReplayLayout::kTopicSeqPayload, ZmqReplayLayout::kSeqPayload}) {
    SCOPED_TRACE(layout == ZmqReplayLayout::kTopicSeqPayload ? "topic,seq,payload" : "seq,payload");
    KvEventLog log;
    zmq::context_t context(1);
    const std::string replay = FreeLoopbackEndpoint();
    ASSERT_FALSE(ZmqEventPublisher::Binds(replay)) << replay;
    absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> publisher =
        ZmqEventPublisher::Start(&log, {.endpoint = "inproc://pub",
                                        .replay_endpoint = replay,
                                        .topic = "kv@a@b",
                                        .replay_layout = layout});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    const std::vector<std::vector<std::string>> replies = Replay(context, replay, 0);
    ASSERT_EQ(replies.size(), 2u);  // event 0 (AllBlocksCleared), then the end marker
    const std::string payload = EncodeVllmBatch(*log.Read(0, 1).events[0]);
    if (layout == ZmqReplayLayout::kTopicSeqPayload) {
      EXPECT_EQ(replies[0],
                (std::vector<std::string>{"", "kv@a@b", EncodeSequenceFrame(0), payload}));
      EXPECT_EQ(replies[1], (std::vector<std::string>{"", "", std::string(8, '\xff'), ""}));
    } else {
      EXPECT_EQ(replies[0], (std::vector<std::string>{"", EncodeSequenceFrame(0), payload}));
      EXPECT_EQ(replies[1], (std::vector<std::string>{"", std::string(8, '\xff'), ""}));
    }
    (*publisher)->Stop();
  }
}

}  // namespace
}  // namespace kvcache
