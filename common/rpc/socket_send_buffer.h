// A larger kernel send buffer on the connections a gRPC channel makes, for channels that carry
// block bytes. gRPC has no public knob for it; it does apply a channel's socket mutator
// (GRPC_ARG_SOCKET_MUTATOR) to every socket it connects, Unix and TCP alike, before the connect.
//
// Why: a Unix stream socket's throughput is paced by its sender's buffer (the receiver has none
// of its own), 208 KiB by default here. A PutBlocks of 8 MiB then went out in ~200 KiB turns, each
// a wake-up of the daemon and of the client: data_plane_bench's put path, 2 MiB blocks over a
// Unix socket, took 141 context switches per 8 MiB in the client and 100 in the daemon. The
// daemon's side of a Unix connection has its own (server/unix_listener.h).
//
// The kernel caps the buffer at net.core.wmem_max; a TCP socket given a size no longer autotunes
// it, hence Unix sockets only unless asked.
//
// Thread safety: thread-safe (the mutator holds only constants).
#ifndef KVCACHE_COMMON_RPC_SOCKET_SEND_BUFFER_H_
#define KVCACHE_COMMON_RPC_SOCKET_SEND_BUFFER_H_

#include <grpcpp/support/channel_arguments.h>

namespace kvcache {

// What block-stream channels ask for: as much as a 4 MiB-wmem_max kernel gives.
inline constexpr int kBlockStreamSendBufferBytes = 4 << 20;

enum class SendBufferSockets { kUnixOnly, kAll };

// Makes every connection of a channel created with `args` ask for a send buffer of `bytes`
// (SO_SNDBUF, before connect). Replaces a socket mutator `args` had.
void SetConnectionSendBuffer(grpc::ChannelArguments* args, int bytes,
                             SendBufferSockets sockets = SendBufferSockets::kUnixOnly);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_SOCKET_SEND_BUFFER_H_
