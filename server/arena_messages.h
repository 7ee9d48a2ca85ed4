// ArenaMessageAllocator: the request and response of a unary callback method on one protobuf
// Arena. A request of thousands of repeated strings (ExistsPages' 4096 keys) is then parsed
// without a malloc per string and freed at once: malloc and free of the keys took ~12% of the
// daemon's samples in perf of `pages_bench 3 exists`.
//
// Thread safety: AllocateMessages is thread-safe (it holds no state); each holder belongs to its
// call.
#ifndef KVCACHE_SERVER_ARENA_MESSAGES_H_
#define KVCACHE_SERVER_ARENA_MESSAGES_H_

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

namespace kvcache {

template <typename Request, typename Response>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder; }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_ARENA_MESSAGES_H_
