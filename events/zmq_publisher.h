// ZmqEventPublisher: the daemon's KV events (cache/kv_event_log.h) on a ZeroMQ PUB socket in
// vLLM's wire format (events/vllm_event_codec.h), so llm-d's and Dynamo's KV-aware routers
// consume them unchanged, plus vLLM's ROUTER replay socket for subscribers that saw a gap.
//
// Each message is three frames [topic, sequence (8 bytes, big-endian), payload], one per event,
// with the event's own sequence number: the numbers a WatchEvents watcher sees; the payload in
// the chosen VllmEventEncoding. Event 0 is the AllBlocksCleared every daemon starts with. A
// replay request [identity, "", start (8 bytes BE)] gets every buffered event from start on, then
// an end marker with sequence 0xFF x 8 (-1) and an empty payload, in one of vLLM's two layouts:
// - kTopicSeqPayload (current vLLM): [identity, "", topic, sequence, payload], end marker
//   [identity, "", "", 0xFF x 8, ""];
// - kSeqPayload (vLLM before the topic was added, and SGLang): [identity, "", sequence, payload],
//   end marker [identity, "", 0xFF x 8, ""].
// A start older than the buffer gets what the buffer holds: the subscriber sees the first
// sequence above what it asked for and rebuilds, as with vLLM.
//
// The PUB endpoint follows vLLM's rule: bind when it holds "*", "::", "ipc://" or "inproc://",
// else connect (llm-d's centralized mode: every publisher connects to the router's SUB). The
// replay endpoint is always bound, as vLLM does: subscribers connect their DEALER to it.
//
// Thread safety: Start and Stop from one thread; one thread of the publisher's own owns both
// sockets (ZeroMQ sockets are not thread-safe).
#ifndef KVCACHE_EVENTS_ZMQ_PUBLISHER_H_
#define KVCACHE_EVENTS_ZMQ_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cache/kv_event_log.h"
#include "events/vllm_event_codec.h"

namespace kvcache {

// The frames of a replay reply after [identity, ""] (see above).
enum class ZmqReplayLayout : uint8_t { kTopicSeqPayload, kSeqPayload };

struct ZmqPublisherOptions {
  std::string endpoint;         // PUB, e.g. "tcp://*:5557"
  std::string replay_endpoint;  // ROUTER, e.g. "tcp://*:5558"; empty: no replay
  std::string topic;            // e.g. "kv@node:gpu-7@Qwen/Qwen3-32B"
  int send_hwm = 100000;        // vLLM's hwm: messages queued per subscriber before drops
  VllmEventEncoding encoding = VllmEventEncoding::kArray;
  ZmqReplayLayout replay_layout = ZmqReplayLayout::kTopicSeqPayload;
};

class ZmqEventPublisher {
 public:
  // INVALID_ARGUMENT naming the endpoint when ZeroMQ cannot bind or connect it. `log` must
  // outlive the publisher.
  static absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> Start(KvEventLog* log,
                                                                  ZmqPublisherOptions options);
  ~ZmqEventPublisher();

  ZmqEventPublisher(const ZmqEventPublisher&) = delete;
  ZmqEventPublisher& operator=(const ZmqEventPublisher&) = delete;

  // Stops the thread and closes the sockets; idempotent.
  void Stop();
  // Messages sent on the PUB socket.
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  const ZmqPublisherOptions& options() const { return options_; }

  // Whether vLLM binds (true) or connects (false) a PUB endpoint (a replay endpoint it always
  // binds).
  static bool Binds(const std::string& endpoint);

 private:
  struct Sockets;
  ZmqEventPublisher(KvEventLog* log, ZmqPublisherOptions options, std::unique_ptr<Sockets> sockets);
  void Run();
  void ServeReplays();
  void Publish(const KvEvent& event);

  KvEventLog* const log_;
  const ZmqPublisherOptions options_;
  std::unique_ptr<Sockets> sockets_;  // used only by thread_ once it runs
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> published_{0};
  uint64_t cursor_ = 0;  // thread_'s: the next sequence to publish
  std::thread thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_EVENTS_ZMQ_PUBLISHER_H_
