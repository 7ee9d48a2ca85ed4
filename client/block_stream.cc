#include "client/block_stream.h"

#include <cassert>

namespace kvcache {
namespace {

// Each op waits for its own completion before the next starts, so one op is in flight at a time;
// distinct tags still let Await check that the queue answered the op it waits for.
char kWriteTag;
char kReadTag;
char kFinishTag;

}  // namespace

BlockStream::BlockStream(grpc::GenericStub* stub, const char* method, absl::Time deadline,
                         bool wait_for_ready)
    : BlockStream(stub, method, [deadline, wait_for_ready](grpc::ClientContext* context) {
        context->set_deadline(absl::ToChronoTime(deadline));
        context->set_wait_for_ready(wait_for_ready);
      }) {}

BlockStream::BlockStream(grpc::GenericStub* stub, const char* method,
                         absl::FunctionRef<void(grpc::ClientContext* context)> prepare) {
  prepare(&context_);
  // The headers leave with the first message, as gRPC's sync calls send them: one op and one
  // HTTP/2 write fewer. A corked StartCall delivers no tag to the queue.
  context_.set_initial_metadata_corked(true);
  call_ = stub->PrepareCall(&context_, method, &cq_);
  if (call_ != nullptr) call_->StartCall(nullptr);
}

BlockStream::~BlockStream() {
  if (!finished_) {
    Cancel();
    Finish();
  }
  // Nothing is in flight: every op was waited for. The queue must be drained before it goes.
  cq_.Shutdown();
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
  }
}

template <typename Start>
bool BlockStream::Await(void* tag, Start start) {
  if (call_ == nullptr) return false;
  start();
  void* got = nullptr;
  bool ok = false;
  if (!cq_.Next(&got, &ok)) return false;  // shut down: not before the destructor
  assert(got == tag);
  return ok;
}

grpc::Slice BlockStream::Lend(const char* data, size_t size) { return loans_.Lend(data, size); }

bool BlockStream::Write(const grpc::ByteBuffer& message) {
  return Await(&kWriteTag, [&] { call_->Write(message, &kWriteTag); });
}

bool BlockStream::WriteLast(const grpc::ByteBuffer& message) {
  return Await(&kWriteTag,
               [&] { call_->Write(message, grpc::WriteOptions().set_last_message(), &kWriteTag); });
}

bool BlockStream::WritesDone() {
  return Await(&kWriteTag, [&] { call_->WritesDone(&kWriteTag); });
}

bool BlockStream::Read(grpc::ByteBuffer* message) {
  return Await(&kReadTag, [&] { call_->Read(message, &kReadTag); });
}

grpc::Status BlockStream::Finish() {
  assert(!finished_);
  finished_ = true;
  if (call_ == nullptr) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "gRPC could not create the call");
  }
  grpc::Status status;
  // Finish's op always completes with ok (the status is what tells); a false here would mean the
  // queue shut down, which only the destructor does.
  Await(&kFinishTag, [&] { call_->Finish(&status, &kFinishTag); });
  return status;
}

BlockStream::Loans::~Loans() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* outstanding) { return *outstanding == 0; }, &outstanding_));
}

grpc::Slice BlockStream::Loans::Lend(const char* data, size_t size) {
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  return grpc::Slice(const_cast<char*>(data), size, &Loans::Return, this);
}

void BlockStream::Loans::Return(void* self) {
  auto* loans = static_cast<Loans*>(self);
  absl::MutexLock lock(&loans->mu_);
  --loans->outstanding_;
}

}  // namespace kvcache
