#include "events/zmq_publisher.h"

#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "events/vllm_event_codec.h"

namespace kvcache {
namespace {

// How long the thread waits for new events before it looks at the replay socket again.
constexpr absl::Duration kPollPeriod = absl::Milliseconds(20);
constexpr size_t kEventsPerRead = 256;

absl::Status Attach(zmq::socket_t& socket, const std::string& endpoint, bool bind,
                    const char* what) {
  try {
    if (bind) {
      socket.bind(endpoint);
    } else {
      socket.connect(endpoint);
    }
  } catch (const zmq::error_t& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV events ", what, " endpoint '", endpoint, "': ", error.what()));
  }
  return absl::OkStatus();
}

}  // namespace

struct ZmqEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t router{context, zmq::socket_type::router};
  bool has_router = false;
};

bool ZmqEventPublisher::Binds(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") || absl::StartsWith(endpoint, "inproc://");
}

absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> ZmqEventPublisher::Start(
    KvEventLog* log, ZmqPublisherOptions options) {
  if (options.endpoint.empty()) return absl::InvalidArgumentError("no KV events endpoint");
  auto sockets = std::make_unique<Sockets>();
  sockets->pub.set(zmq::sockopt::linger, 0);
  sockets->pub.set(zmq::sockopt::sndhwm, options.send_hwm);
  if (absl::Status attached =
          Attach(sockets->pub, options.endpoint, Binds(options.endpoint), "PUB");
      !attached.ok()) {
    return attached;
  }
  if (!options.replay_endpoint.empty()) {
    sockets->router.set(zmq::sockopt::linger, 0);
    // Always bound, whatever the endpoint looks like: vLLM binds its ROUTER and subscribers
    // connect to it (a connecting ROUTER would answer no one).
    if (absl::Status attached =
            Attach(sockets->router, options.replay_endpoint, /*bind=*/true, "replay");
        !attached.ok()) {
      return attached;
    }
    sockets->has_router = true;
  }
  auto publisher = std::unique_ptr<ZmqEventPublisher>(
      new ZmqEventPublisher(log, std::move(options), std::move(sockets)));
  publisher->thread_ = std::thread([raw = publisher.get()] { raw->Run(); });
  return publisher;
}

ZmqEventPublisher::ZmqEventPublisher(KvEventLog* log, ZmqPublisherOptions options,
                                     std::unique_ptr<Sockets> sockets)
    : log_(log), options_(std::move(options)), sockets_(std::move(sockets)) {}

ZmqEventPublisher::~ZmqEventPublisher() { Stop(); }

void ZmqEventPublisher::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  sockets_.reset();
}

void ZmqEventPublisher::Run() {
  while (!stopping_.load()) {
    ServeReplays();
    if (!log_->WaitFor(cursor_, kPollPeriod)) continue;
    // Let more gather until the first one's flush deadline: the messages of a burst then go out
    // in one turn of the thread (one wake-up of ZeroMQ's I/O thread) instead of one turn each,
    // and none later than kKvEventMaxDelay after it happened (as WatchEvents,
    // server/watch_events.cc).
    log_->WaitForFlush(cursor_);
    KvEventLog::ReadResult read = log_->Read(cursor_, kEventsPerRead);
    if (read.lost) {
      // Fell behind the buffer: the gap shows in the sequence numbers.
      const uint64_t first = log_->first_sequence();
      log_->CountDropped(KvEventSink::kZmq, first - cursor_);
      cursor_ = first;
      continue;
    }
    for (const auto& event : read.events) Publish(*event);
    cursor_ = read.next_sequence;
  }
}

void ZmqEventPublisher::Publish(const KvEvent& event) {
  const std::string sequence = EncodeSequenceFrame(event.sequence);
  const std::string payload = EncodeVllmBatch(event, options_.encoding);
  zmq::socket_t& pub = sockets_->pub;
  // PUB never blocks: past the high-water mark ZeroMQ drops, and subscribers see the gap.
  pub.send(zmq::buffer(options_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub.send(zmq::buffer(sequence), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  published_.fetch_add(1, std::memory_order_relaxed);
}

void ZmqEventPublisher::ServeReplays() {
  if (!sockets_->has_router) return;
  zmq::socket_t& router = sockets_->router;
  while (true) {
    std::vector<zmq::message_t> request;
    zmq::recv_result_t received;
    try {
      received =
          zmq::recv_multipart(router, std::back_inserter(request), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!received.has_value()) return;
    // [identity, "", start]; anything else is not vLLM's protocol and gets no answer.
    if (request.size() != 3 || request[1].size() != 0 || request[2].size() != 8) continue;
    const auto* bytes = static_cast<const uint8_t*>(request[2].data());
    uint64_t start = 0;
    for (int i = 0; i < 8; ++i) start = (start << 8) | bytes[i];
    log_->CountReplay(KvEventSink::kZmq);
    const std::string identity = request[0].to_string();
    const bool with_topic = options_.replay_layout == ZmqReplayLayout::kTopicSeqPayload;
    const auto send = [&](const std::string& topic, const std::string& sequence,
                          const std::string& payload) {
      router.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      router.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      if (with_topic) router.send(zmq::buffer(topic), zmq::send_flags::sndmore);
      router.send(zmq::buffer(sequence), zmq::send_flags::sndmore);
      router.send(zmq::buffer(payload), zmq::send_flags::none);
    };
    // Everything the buffer holds from `start` to now (from its oldest when start is older).
    const uint64_t end = log_->next_sequence();
    uint64_t next = std::max(start, log_->first_sequence());
    while (next < end) {
      KvEventLog::ReadResult read = log_->Read(next, kEventsPerRead);
      if (read.lost) {
        next = log_->first_sequence();
        continue;
      }
      if (read.events.empty()) break;
      for (const auto& event : read.events) {
        if (event->sequence >= end) break;
        send(options_.topic, EncodeSequenceFrame(event->sequence),
             EncodeVllmBatch(*event, options_.encoding));
      }
      next = read.next_sequence;
    }
    send("", std::string(8, '\xff'), "");
  }
}

}  // namespace kvcache
