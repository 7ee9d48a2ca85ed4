// gRPC's polling engine for processes that move block bytes: the daemon, the workers, and any
// client that streams blocks. Call first thing in main(), before any thread or channel exists.
#ifndef KVCACHE_COMMON_POLL_ENGINE_H_
#define KVCACHE_COMMON_POLL_ENGINE_H_

namespace kvcache {

// Picks gRPC's "poll" engine over its default, "epoll1", unless GRPC_POLL_STRATEGY already
// names an engine (the operator's choice wins). Measured with data_plane_bench (2 MiB blocks over
// a Unix socket, interleaved runs, medians): a copy-free get +20% with both ends on poll, a get
// into the caller's buffer +11%, about half of it from either end. perf stat of a 3 s get run
// (whole machine): a quarter fewer context switches and two thirds fewer CPU migrations. epoll1
// lets one thread at a time wait in epoll and wakes the others through it; poll has each waiting
// thread poll its own calls' descriptors. But poll scans all of them on every wake: a daemon
// serving hundreds of connections should set GRPC_POLL_STRATEGY=epoll1.
// Process-wide, hence explicit: a library does not call it on its own. Returns whether gRPC will
// use poll: false where GRPC_POLL_STRATEGY names something else, or where gRPC already started
// (its engine is chosen once).
bool UsePollEngineForBlockStreams();

}  // namespace kvcache

#endif  // KVCACHE_COMMON_POLL_ENGINE_H_
