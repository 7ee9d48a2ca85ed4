"""The wire side of the block data RPCs (PutBlocks, GetBlocks) without protobuf copies.

A block's bytes travel in a `bytes` field of the stream's messages. Building those messages with
protobuf would copy each chunk into a message and serialize it again (put), or parse it out of the
message into a new `bytes` object (get). Instead, like the C++ client (client/block_stream.h), the
messages are written and read raw:
  - put: each data message is the field's tag and length followed by the chunk, joined into the
    one `bytes` object gRPC sends (the one copy out of the caller's buffer);
  - get: each received message is split where its data field lies, and the data is checksummed
    and copied straight from gRPC's received bytes into the destination (the one copy into it).
Each block's XXH3-64 (seed 0, python3-xxhash) is the checksum the daemon and the C++ client use
(common/block_checksum.h).

Thread safety: a BlockVerifier belongs to one stream; the functions are pure.
"""

from typing import Callable, Optional, Sequence, Tuple

import grpc

from ._proto import kvcache_pb2
from .errors import KvCacheError
from .hashing import xxhash  # checked there for XXH3

PUT_DATA_FIELD = kvcache_pb2.PutBlocksRequest.DATA_FIELD_NUMBER
GET_HEADER_FIELD = kvcache_pb2.GetBlocksResponse.HEADER_FIELD_NUMBER
GET_DATA_FIELD = kvcache_pb2.GetBlocksResponse.DATA_FIELD_NUMBER
GET_EPOCH_FIELD = kvcache_pb2.GetBlocksResponse.EPOCH_FIELD_NUMBER

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES, _WIRE_FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: memoryview, offset: int) -> Tuple[int, int]:
    """The varint at `offset` and the offset after it; ValueError when truncated."""
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def put_data_message(chunk: memoryview) -> bytes:
    """A serialized PutBlocksRequest{data: chunk}: tag, length, then the chunk (copied once)."""
    return b"".join((_varint(PUT_DATA_FIELD << 3 | _WIRE_BYTES), _varint(len(chunk)), chunk))


class GetMessage:
    """One GetBlocksResponse, split: its epoch, its header (parsed) or its data (a view into the
    received bytes, not a copy)."""

    __slots__ = ("epoch", "header", "data")

    def __init__(self, epoch: int, header: Optional[kvcache_pb2.GetBlocksHeader],
                 data: Optional[memoryview]) -> None:
        self.epoch = epoch
        self.header = header
        self.data = data


def split_get_message(raw: bytes) -> GetMessage:
    """The response deserializer of GetBlocks. Fields it does not know are skipped, as protobuf
    does; a malformed message raises ValueError (gRPC then fails the call with INTERNAL)."""
    view = memoryview(raw)
    offset = 0
    epoch = 0
    header = None
    data = None
    while offset < len(view):
        key, offset = _read_varint(view, offset)
        field, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            _, offset = _read_varint(view, offset)
        elif wire == _WIRE_FIXED64:
            if field == GET_EPOCH_FIELD:
                epoch = int.from_bytes(view[offset:offset + 8], "little")
            offset += 8
        elif wire == _WIRE_FIXED32:
            offset += 4
        elif wire == _WIRE_BYTES:
            size, offset = _read_varint(view, offset)
            if field == GET_DATA_FIELD:
                data = view[offset:offset + size]
            elif field == GET_HEADER_FIELD:
                header = kvcache_pb2.GetBlocksHeader.FromString(view[offset:offset + size])
            offset += size
        else:
            raise ValueError(f"GetBlocksResponse: unexpected wire type {wire}")
        if offset > len(view):
            raise ValueError("GetBlocksResponse: a field runs past the message")
    return GetMessage(epoch, header, data)


def block_checksums(data: memoryview, block_bytes: int) -> list:
    """XXH3-64 of each block of `data` (a whole number of blocks)."""
    return [xxhash.xxh3_64_intdigest(data[start:start + block_bytes])
            for start in range(0, len(data), block_bytes)]


class BlockVerifier:
    """Checks the per-block checksums of a stream of whole blocks arriving in pieces of any size,
    and hands each piece to `sink(offset, piece)` (offset into the stream) before the checksum of
    the block it completes is checked, as common/block_checksum.h does."""

    def __init__(self, block_bytes: int, checksums: Sequence[int],
                 sink: Callable[[int, memoryview], None]) -> None:
        self.block_bytes = block_bytes
        self.checksums = list(checksums)
        self.expected_bytes = block_bytes * len(self.checksums)
        self.received_bytes = 0
        self._sink = sink
        self._hasher = xxhash.xxh3_64()

    def feed(self, piece: memoryview) -> None:
        """REQUIRES: len(piece) <= expected_bytes - received_bytes. DATA_LOSS naming the block
        whose checksum differs."""
        self._sink(self.received_bytes, piece)
        while len(piece) > 0:
            in_block = self.received_bytes % self.block_bytes
            take = min(len(piece), self.block_bytes - in_block)
            self._hasher.update(piece[:take])
            piece = piece[take:]
            self.received_bytes += take
            if self.received_bytes % self.block_bytes == 0:
                block = self.received_bytes // self.block_bytes - 1
                got = self._hasher.intdigest()
                self._hasher.reset()
                if got != self.checksums[block]:
                    raise KvCacheError(
                        grpc.StatusCode.DATA_LOSS,
                        f"block {block} failed its checksum: XXH3-64 {got:016x}, the daemon's "
                        f"{self.checksums[block]:016x}")
