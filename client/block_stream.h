// BlockStream: one blocking call of a streaming RPC whose messages are raw bytes
// (grpc::ByteBuffer), for the block data RPCs (PutBlocks, GetBlocks), which write and read their
// messages raw so that block bytes are neither copied into nor parsed out of protobuf messages
// (common/rpc/bytes_field_split.h).
//
// It drives gRPC's public generic stub (grpc::GenericStub) over a completion queue of its own:
// every operation starts one asynchronous op and waits for it, so the call reads like gRPC's sync
// API. On the wire every method is called as a bidi stream, which a server accepts for a client-
// or server-streaming method alike: write the one request of a server-streaming method with
// WriteLast; read the one reply of a client-streaming method with Read before Finish.
//
// Errors: Write, WriteLast, WritesDone and Read return false when the stream broke or, for Read,
// ended; Finish then says why (the server's status, CANCELLED after Cancel, DEADLINE_EXCEEDED...).
//
// Memory: Lend hands the caller's bytes to gRPC without a copy. gRPC may hold such a slice past
// the write that sent it (a write still draining when the call failed): the destructor waits
// until gRPC dropped every one, so the lent memory may go once the stream is gone.
//
// Thread safety: thread-compatible; one thread drives a stream. Cancel may be called from any
// thread and makes a blocked operation return.
#ifndef KVCACHE_CLIENT_BLOCK_STREAM_H_
#define KVCACHE_CLIENT_BLOCK_STREAM_H_

#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvcache {

class BlockStream {
 public:
  // Starts a call of `method` ("/package.Service/Method") on `stub`'s channel, which must outlive
  // the stream. `prepare` readies the call's context before the call starts (its deadline,
  // wait_for_ready, metadata such as credentials); it runs once, within the constructor. Nothing
  // goes on the wire before the first write: the call's headers leave with it.
  BlockStream(grpc::GenericStub* stub, const char* method,
              absl::FunctionRef<void(grpc::ClientContext* context)> prepare);
  // Same, for a call that needs only a deadline and wait_for_ready.
  BlockStream(grpc::GenericStub* stub, const char* method, absl::Time deadline,
              bool wait_for_ready);
  // Cancels the call if it was not finished, then waits for gRPC to drop every lent slice.
  ~BlockStream();

  BlockStream(const BlockStream&) = delete;
  BlockStream& operator=(const BlockStream&) = delete;

  // A slice of [data, data + size), which must stay unchanged until the stream is destroyed.
  grpc::Slice Lend(const char* data, size_t size);

  bool Write(const grpc::ByteBuffer& message);
  // Writes `message` and half-closes the stream in one op.
  bool WriteLast(const grpc::ByteBuffer& message);
  bool WritesDone();
  // Takes the next message as gRPC received it (its slices, not a copy).
  bool Read(grpc::ByteBuffer* message);
  // The call's status. REQUIRES: called once, and no other operation after it; all messages the
  // server sent were read or the call was cancelled (gRPC delivers the status after them).
  grpc::Status Finish();

  // Best effort: a call that already finished is not changed.
  void Cancel() { context_.TryCancel(); }
  // The finished call's trailing metadata, among others.
  const grpc::ClientContext& context() const { return context_; }

 private:
  // Counts the slices lent and not yet dropped by gRPC.
  class Loans {
   public:
    Loans() = default;
    Loans(const Loans&) = delete;
    Loans& operator=(const Loans&) = delete;
    ~Loans();  // waits for every loan to come back

    grpc::Slice Lend(const char* data, size_t size);

   private:
    static void Return(void* self);

    absl::Mutex mu_;
    int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  };

  // Starts an op with `tag` by `start` and waits for it; false when gRPC says it failed.
  template <typename Start>
  bool Await(void* tag, Start start);

  // Destroyed in reverse order: the call, then the context (which holds gRPC's last reference
  // to the call, and with it to any slice still queued), then the loans, then the queue.
  grpc::CompletionQueue cq_;
  Loans loans_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool finished_ = false;
};

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_BLOCK_STREAM_H_
