#include "common/rpc/socket_send_buffer.h"

#include <grpc/support/sync.h>
#include <sys/socket.h>

// gRPC 1.51 declares grpc_socket_mutator in its public headers but defines it in
// src/core/lib/iomgr/socket_mutator.h, which Debian does not ship. Its layout has been stable
// since 1.27 (mutate_fd_2 added then) and is what every out-of-tree mutator relies on (gRPC's own
// end-to-end tests do the same); gRPC calls mutate_fd_2 when it is set.
typedef enum {
  GRPC_FD_CLIENT_CONNECTION_USAGE,
  GRPC_FD_SERVER_LISTENER_USAGE,
  GRPC_FD_SERVER_CONNECTION_USAGE,
} grpc_fd_usage;

typedef struct {
  int fd;
  grpc_fd_usage usage;
} grpc_mutate_socket_info;

struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator);
};

struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};

namespace kvcache {
namespace {

struct SendBufferMutator {
  grpc_socket_mutator base;  // first: gRPC hands back &base
  int bytes;
  SendBufferSockets sockets;
};

SendBufferMutator* Of(grpc_socket_mutator* mutator) {
  return reinterpret_cast<SendBufferMutator*>(mutator);
}

bool IsUnixSocket(int fd) {
  int domain = 0;
  socklen_t size = sizeof(domain);
  return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 && domain == AF_UNIX;
}

// Best effort: a socket that refuses keeps its default buffer, and still carries the call.
bool Mutate(int fd, grpc_socket_mutator* mutator) {
  const SendBufferMutator& self = *Of(mutator);
  if (self.sockets == SendBufferSockets::kAll || IsUnixSocket(fd)) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &self.bytes, sizeof(self.bytes));
  }
  return true;
}

bool MutateConnection(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator) {
  if (info->usage == GRPC_FD_SERVER_LISTENER_USAGE) return true;
  return Mutate(info->fd, mutator);
}

// Equal settings compare equal, so channels that ask for the same buffer may share connections.
int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) {
  const SendBufferMutator& left = *Of(a);
  const SendBufferMutator& right = *Of(b);
  if (left.bytes != right.bytes) return left.bytes < right.bytes ? -1 : 1;
  if (left.sockets != right.sockets) return left.sockets < right.sockets ? -1 : 1;
  return 0;
}

void Destroy(grpc_socket_mutator* mutator) { delete Of(mutator); }

constexpr grpc_socket_mutator_vtable kVtable = {
    .mutate_fd = Mutate, .compare = Compare, .destroy = Destroy, .mutate_fd_2 = MutateConnection};

}  // namespace

void SetConnectionSendBuffer(grpc::ChannelArguments* args, int bytes, SendBufferSockets sockets) {
  auto* mutator = new SendBufferMutator{.base = {}, .bytes = bytes, .sockets = sockets};
  mutator->base.vtable = &kVtable;
  gpr_ref_init(&mutator->base.refcount, 1);
  args->SetSocketMutator(&mutator->base);  // takes the reference
}

}  // namespace kvcache
