"""Process-wide settings for a Python process that streams block bytes (put_blocks,
get_blocks_into): the twins of the C++ TuneGrpcForBlockStreams and TuneMallocForBlockStreams
(docs/tuning.md). Process-wide, hence explicit: the client never calls them on its own.
"""

import ctypes
import ctypes.util
import os

# What gRPC reads when it starts, each kept when the operator set it (docs/tuning.md):
# poll over epoll1 (fewer context switches), and whole-message reads instead of 64 KiB slices.
GRPC_SETTINGS = {"GRPC_POLL_STRATEGY": "poll", "GRPC_EXPERIMENTS": "-tcp_read_chunks"}
# glibc's mallopt parameters (malloc.h) and the values the C++ tuning uses.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD_BYTES, _MMAP_THRESHOLD_BYTES = 64 << 20, 32 << 20


def tune_for_block_streams() -> bool:
    """Sets GRPC_SETTINGS in the environment where the operator has not set them, and has glibc
    keep freed memory for reuse instead of handing each received message's pages back to the
    kernel. Call it first thing, before this process makes any gRPC channel or server: gRPC
    reads the variables when it starts (a later call changes only the allocator). Returns
    whether every setting holds: false where the operator chose other values, or where the C
    library is not glibc (or an interposed allocator ignores mallopt)."""
    grpc_settings_hold = True
    for name, value in GRPC_SETTINGS.items():
        grpc_settings_hold &= os.environ.setdefault(name, value) == value
    return grpc_settings_hold and _tune_malloc()


def _tune_malloc() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        return False
    if mallopt is None:
        return False
    return (mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1)
