// HTTP/2 settings for channels that carry block bytes, used by the daemon and its clients alike.
// Block bytes move in MiB-sized messages: with the 16 KiB default frames and 64 KiB default
// window, per-frame work and flow-control round trips dominate a stream's time. Flow control is
// the receiver's: the daemon's window paces puts, the client's paces gets.
#ifndef KVCACHE_COMMON_RPC_HTTP2_TUNING_H_
#define KVCACHE_COMMON_RPC_HTTP2_TUNING_H_

namespace kvcache {

inline constexpr int kHttp2FrameBytes = (1 << 24) - 1;  // the largest frame HTTP/2 allows
inline constexpr int kHttp2WindowBytes = 8 << 20;       // per stream (lookahead)

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_HTTP2_TUNING_H_
