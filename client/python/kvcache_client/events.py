"""KV events from WatchEvents (proto/kvcache/v1/kvcache.proto): batches, resume points, and the
cursor both clients' watch_events() keep.

A watcher resumes from the next_sequence and epoch of the last batch it received: nothing is
missed or doubled. A start the daemon no longer holds (a restart, a buffer overrun) gets a
snapshot: AllBlocksCleared, every cached block as BlocksStored, the last batch marked
`snapshot_end`; its earlier batches repeat the old resume point, so a stream cut during a
snapshot starts a new snapshot. The events themselves are the generated kvcache_pb2.KvEvent
messages (one of blocks_stored, blocks_removed, all_blocks_cleared).

Pages (pages named by an engine's keys) are named by the engine's key, not by tokens: the pages
one call stored are one BlocksStored with a StoredBlock per page, in the call's key order, each
with `page_key` set (the key's bytes) and no token_ids, no parent (no page has one), and
`manifest_digest` (32 hex digits; empty when a restarted daemon found the page on disk); a BlocksRemoved that removes a page has `page_keys`, one per hash (b"" for a token
block). `page_keys_of` reads them from either.
"""

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

import grpc

from ._proto import kvcache_pb2
from .errors import KvCacheError, make_request

# Codes after which a watch may go on from where it was: the daemon went away or is draining.
_RESUMABLE = (grpc.StatusCode.UNAVAILABLE,)
RESUME_PAUSE = 0.1  # seconds between a broken stream and the next try, so a draining daemon
#                     that refuses watchers is not asked in a tight loop


@dataclass(frozen=True)
class ResumePoint:
    """Where a watch starts: `sequence` 0 is everything; `epoch` 0 is the daemon's own."""
    sequence: int = 0
    epoch: int = 0


@dataclass(frozen=True)
class EventBatch:
    """One WatchEventsResponse."""
    epoch: int  # the daemon start that sent it
    events: List[kvcache_pb2.KvEvent]
    next_sequence: int
    head_sequence: int  # the daemon's next sequence: caught up once next_sequence reaches it
    snapshot: bool  # part of a snapshot
    snapshot_end: bool  # the snapshot's last batch: from here on the stream is live
    resume_point: ResumePoint  # where a later watch_events(start=...) goes on from


class WatchCursor:
    """The state of one watch across reconnections: its request and its resume point."""

    def __init__(self, start: ResumePoint, pool: str, tenant: str) -> None:
        self.resume_point = start
        self.failure: Optional[grpc.RpcError] = None  # what broke the last stream, if anything
        self._pool = pool
        self._tenant = tenant
        self.request()  # bad arguments fail before the first call

    def request(self) -> kvcache_pb2.WatchEventsRequest:
        return make_request("watch_events", kvcache_pb2.WatchEventsRequest,
                            start_sequence=self.resume_point.sequence,
                            epoch=self.resume_point.epoch, tenant=self._tenant, pool=self._pool)

    def advance(self, response: kvcache_pb2.WatchEventsResponse) -> EventBatch:
        """The batch, with the resume point moved past it (a snapshot's middle batches carry
        the point the watch came with, so resuming from them snapshots again)."""
        self.resume_point = ResumePoint(response.next_sequence, response.epoch)
        return EventBatch(epoch=response.epoch, events=list(response.events),
                          next_sequence=response.next_sequence,
                          head_sequence=response.head_sequence, snapshot=response.snapshot,
                          snapshot_end=response.snapshot_end, resume_point=self.resume_point)

    @contextlib.contextmanager
    def reading(self, stream: Any, resume: bool) -> Iterator[None]:
        """Around the reading of one WatchEvents stream: a gRPC error that ends the watch is
        raised as KvCacheError, one it may resume from (the daemon went away or is draining)
        is kept in `failure`; the stream is cancelled whatever happens (the caller stopped
        iterating, too)."""
        self.failure = None
        try:
            yield
        except grpc.RpcError as error:
            if not (resume and error.code() in _RESUMABLE):
                raise KvCacheError.from_rpc_error("WatchEvents", error) from None
            self.failure = error
        finally:
            stream.cancel()

    def gone(self, waited: float) -> KvCacheError:
        """The error of a watch whose daemon did not come back within `waited` seconds."""
        why = f" ({self.failure.details()})" if self.failure is not None else ""
        return KvCacheError(grpc.StatusCode.UNAVAILABLE,
                            f"WatchEvents: the stream broke{why} and no daemon came back within "
                            f"{waited:g}s; resume later from {self.resume_point}")


def page_keys_of(event: kvcache_pb2.KvEvent) -> List[bytes]:
    """The engine keys of the pages an event stores or removes (b"" for a token block); empty
    when it names no page."""
    kind = event.WhichOneof("kind")
    if kind == "blocks_stored":
        keys = [block.page_key for block in event.blocks_stored.blocks]
        return keys if any(keys) else []
    if kind == "blocks_removed":
        return list(event.blocks_removed.page_keys)
    return []
