// gRPC's process-wide settings for processes that move block bytes: the daemon, the workers, and
// any client that streams blocks. Call first thing in main(), before any thread exists or any
// gRPC function ran. (Per-channel settings are in common/rpc/http2_tuning.h.)
#ifndef KVCACHE_COMMON_RPC_GRPC_TUNING_H_
#define KVCACHE_COMMON_RPC_GRPC_TUNING_H_

namespace kvcache {

// Sets, for gRPC to read when it starts, each of these that the operator has not set:
// - GRPC_POLL_STRATEGY=poll, over the default epoll1. epoll1 lets one thread at a time wait in
//   epoll and wakes the others through it; poll has each waiting thread poll its own calls'
//   descriptors. perf stat of a 3 s get run (whole machine): a quarter fewer context switches,
//   two thirds fewer CPU migrations. But poll scans every descriptor on each wake: a daemon
//   serving hundreds of connections should set GRPC_POLL_STRATEGY=epoll1.
// - GRPC_EXPERIMENTS=-tcp_read_chunks. gRPC 1.51 reads into 64 KiB slices by default, so a
//   2 MiB message took 32 slices and reads; without the experiment a read fills one slice sized
//   to what is expected (up to 4 MiB).
// Measured with data_plane_bench (2 MiB blocks over a Unix socket, interleaved runs, medians):
// poll on both ends, a copy-free get +14-20% and a get into the caller's buffer +7-11%; on top
// of it, whole-message reads, +10% and +2.5%.
// Process-wide, hence explicit: a library does not call it on its own. Returns whether both
// settings will hold: false where the operator chose otherwise, or where gRPC already started.
bool TuneGrpcForBlockStreams();

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_GRPC_TUNING_H_
