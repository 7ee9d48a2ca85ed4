#!/usr/bin/env python3
"""KV events in vLLM's ZeroMQ wire format from a real kvcache-manager, decoded by a subscriber
written the way llm-d's and Dynamo's are: frames [topic, seq u64 big-endian, msgpack payload],
payload a 3-element array [ts, events, dp_rank], events positional arrays tagged by class name,
uint64 hashes. A workload with evictions runs through the gRPC API (Debian python3-grpcio, stubs
from our proto); the index built from the events answers every prompt as the daemon's Lookup
does; a subscriber that misses messages detects the gap by sequence number and fills it through
the ROUTER replay socket. Run twice: with the defaults (positional events, replies
[topic, seq, payload], replay over ipc://), and with the other shapes the daemon serves
(--kv_events_encoding=map: current vLLM's tagged maps; --kv_events_replay_layout=seq_payload:
older vLLM's and SGLang's replies [seq, payload]) with the replay socket on
tcp://127.0.0.1:PORT, which the daemon must bind (as vLLM does), not connect. And in llm-d's
centralized mode: the router binds its SUB and the daemon's PUB endpoint (a host and port, no
'*') connects to it, as the daemon's start-up line says.

Env: KVCACHE_BIN_DIR, PYTHONPATH with the generated stubs.
"""
import os
import random
import re
import socket as pysocket
import struct
import subprocess
import tempfile
import time
import unittest

import grpc
import msgpack
import zmq

from kvcache.v1 import kvcache_pb2
from kvcache.v1 import kvcache_pb2_grpc

BIN_DIR = os.environ["KVCACHE_BIN_DIR"]
BLOCK_SIZE = 4
TOPIC = b"kv@node:test@tiny"
END_SEQUENCE = b"\xff" * 8


class Index:
    """What a router keeps: hash -> (parent, tokens), walked by tokens from a prompt's start."""

    def __init__(self):
        self.blocks = {}  # hash -> (parent, tuple of tokens)
        self.problems = []

    def apply(self, event):
        tag = event[0]
        if tag == "BlockStored":
            hashes, parent, tokens, block_size = event[1], event[2], event[3], event[4]
            if block_size != BLOCK_SIZE or len(tokens) != len(hashes) * block_size:
                self.problems.append(f"bad token count in {event}")
            if parent is not None and parent not in self.blocks:
                self.problems.append(f"child {hashes[0]} before its parent {parent}")
            for i, block_hash in enumerate(hashes):
                if block_hash in self.blocks:
                    self.problems.append(f"stored twice: {block_hash}")
                chunk = tuple(tokens[i * block_size:(i + 1) * block_size])
                self.blocks[block_hash] = (parent, chunk)
                parent = block_hash
        elif tag == "BlockRemoved":
            for block_hash in event[1]:
                if self.blocks.pop(block_hash, None) is None:
                    self.problems.append(f"removed but not held: {block_hash}")
        elif tag == "AllBlocksCleared":
            self.blocks.clear()
        else:
            self.problems.append(f"unknown tag {tag}")

    def cached_blocks(self, tokens):
        children = {(parent, chunk): h for h, (parent, chunk) in self.blocks.items()}
        parent, count = None, 0
        for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
            child = children.get((parent, tuple(tokens[start:start + BLOCK_SIZE])))
            if child is None:
                break
            parent, count = child, count + 1
        return count


MAP_FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def positional(event, problems):
    """A tagged map (vLLM's msgspec struct, tag=True, no array_like) as the positional array."""
    tag = event.get("type")
    if tag not in MAP_FIELDS or list(event) != ["type"] + MAP_FIELDS[tag]:
        problems.append(f"not one of vLLM's tagged maps: {event!r}")
        return [tag]
    return [tag] + [event[field] for field in MAP_FIELDS[tag]]


def decode(payload, problems, encoding="array"):
    """vLLM's EventBatch, exactly: a 3-element array [float ts, [events], int dp_rank]."""
    batch = msgpack.unpackb(payload, raw=False)
    if not (isinstance(batch, list) and len(batch) == 3):
        problems.append(f"envelope is not a 3-element array: {batch!r}")
        return []
    ts, events, dp_rank = batch
    if not isinstance(ts, float) or not isinstance(dp_rank, int) or not isinstance(events, list):
        problems.append(f"envelope types: {batch!r}")
    if encoding == "map":
        events = [positional(e, problems) if isinstance(e, dict) else e for e in events]
    for event in events:
        if not isinstance(event, list) or not isinstance(event[0], str):
            problems.append(f"event is not a tagged positional array: {event!r}")
            continue
        hashes = event[1] if event[0] in ("BlockStored", "BlockRemoved") else []
        if event[0] == "BlockStored" and event[2] is not None:
            hashes = hashes + [event[2]]
        if any(not isinstance(h, int) or h < 0 or h >= 1 << 64 for h in hashes):
            problems.append(f"hash is not a uint64: {event!r}")
        if event[0] == "BlockStored" and (len(event) != 8 or event[6] not in ("CPU", "GPU")):
            problems.append(f"BlockStored fields: {event!r}")
    return events


class Subscriber:
    """A SUB socket plus the replay DEALER; applies every sequence number once, in order."""

    def __init__(self, context, endpoint, replay_endpoint, skip=None, encoding="array",
                 layout="topic_seq_payload", bind=False):
        self.encoding = encoding
        self.layout = layout
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        if bind:  # llm-d's centralized mode: the publishers connect to the router
            self.sub.bind(endpoint)
        else:
            self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.context = context
        self.index = Index()
        self.last = -1
        self.skip = skip or (lambda seq: False)  # messages this subscriber "loses"
        self.gaps_filled = 0

    def replay(self, start):
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", struct.pack(">Q", start)])
        while True:
            if not dealer.poll(10000):
                raise AssertionError("replay: no end marker within 10 s")
            frames = dealer.recv_multipart()
            assert frames[0] == b"", frames
            if self.layout == "topic_seq_payload":
                topic, seq, payload = frames[1:]  # current vLLM: exactly 3 frames
            else:
                seq, payload = frames[1:]  # older vLLM, SGLang: exactly 2 frames
                topic = b"" if seq == END_SEQUENCE else TOPIC
            if seq == END_SEQUENCE:
                assert topic == b"" and payload == b""
                break
            assert topic == TOPIC, topic
            self.apply(struct.unpack(">Q", seq)[0], payload)
        dealer.close(0)

    def apply(self, seq, payload):
        if seq <= self.last:
            return  # already applied (a replay overlapping live messages)
        assert seq == self.last + 1, f"sequence {seq} after {self.last}"
        for event in decode(payload, self.index.problems, self.encoding):
            self.index.apply(event)
        self.last = seq

    def on_message(self, frames):
        topic, seq_frame, payload = frames
        assert topic == TOPIC, topic
        assert len(seq_frame) == 8
        seq = struct.unpack(">Q", seq_frame)[0]
        if self.skip(seq):
            return
        if seq > self.last + 1:
            self.gaps_filled += 1
            self.replay(self.last + 1)
        self.apply(seq, payload)

    def drain(self, quiet_s=0.5):
        while self.sub.poll(int(quiet_s * 1000)):
            self.on_message(self.sub.recv_multipart())


def free_loopback_port():
    with pysocket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class KvEventsZmqTest(unittest.TestCase):
    ENCODING = "array"
    LAYOUT = "topic_seq_payload"
    PUB_STARTUP = "PUB bound at ipc://"  # what the start-up line says of the PUB endpoint

    def endpoint_for(self, directory):
        return "ipc://" + os.path.join(directory, "events.sock")

    def replay_endpoint_for(self, directory):
        return "ipc://" + os.path.join(directory, "replay.sock")

    def subscriber(self, **kwargs):
        return Subscriber(self.context, self.endpoint, self.replay_endpoint,
                          encoding=self.ENCODING, layout=self.LAYOUT, **kwargs)

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        socket = os.path.join(self.dir.name, "kv.sock")
        self.endpoint = self.endpoint_for(self.dir.name)
        self.replay_endpoint = self.replay_endpoint_for(self.dir.name)
        self.daemon = subprocess.Popen(
            [os.path.join(BIN_DIR, "kvcache-manager"), "--listen=unix://" + socket,
             "--pool=small:blocks=32:block_size=4", "--drain_period=0s",
             "--kv_events_endpoint=" + self.endpoint,
             "--kv_events_replay_endpoint=" + self.replay_endpoint,
             "--kv_events_encoding=" + self.ENCODING,
             "--kv_events_replay_layout=" + self.LAYOUT,
             "--kv_events_topic=" + TOPIC.decode()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.daemon.stdout.readline()
            self.assertTrue(line, "kvcache-manager exited: " + "".join(lines))
            lines.append(line)
            if line.startswith("  pool "):
                break
        self.assertTrue(any(re.search("kv events: " + self.PUB_STARTUP + ".* topic kv@node:test@tiny", l)
                            for l in lines), lines)
        self.channel = grpc.insecure_channel("unix:" + socket)
        self.stub = kvcache_pb2_grpc.KvCacheStub(self.channel)
        self.context = zmq.Context()

    def tearDown(self):
        self.channel.close()
        self.context.destroy(0)
        self.daemon.terminate()
        self.assertEqual(self.daemon.wait(timeout=30), 0)
        self.dir.cleanup()

    def prompts(self):
        rng = random.Random(15)
        prompts = []
        for p in range(40):
            prompt = list(range((p % 4) * 10000, (p % 4) * 10000 + (1 + p % 3) * BLOCK_SIZE))
            prompt += list(range(p * 100 + 1, p * 100 + 2 + rng.randrange(3 * BLOCK_SIZE)))
            prompts.append(prompt)
        return prompts

    def workload(self, steps, seed):
        """Random prompts opened, committed and released; the pool overflows and evicts."""
        rng = random.Random(seed)
        session = self.stub.OpenSession(kvcache_pb2.OpenSessionRequest(client_name="zmq-test"))
        held = []
        for _ in range(steps):
            prompt = rng.choice(self.prompts())
            try:
                opened = self.stub.OpenSequence(kvcache_pb2.OpenSequenceRequest(
                    session_id=session.session_id, pool="small", tokens=prompt))
                self.stub.CommitSequence(kvcache_pb2.CommitSequenceRequest(
                    session_id=session.session_id, sequence_id=opened.sequence_id,
                    num_written_tokens=len(prompt)))
                held.append(opened.sequence_id)
            except grpc.RpcError as error:
                self.assertEqual(error.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            while len(held) > rng.randrange(3):
                self.stub.ReleaseSequence(kvcache_pb2.ReleaseSequenceRequest(
                    session_id=session.session_id, sequence_id=held.pop(0)))
        for sequence_id in held:
            self.stub.ReleaseSequence(kvcache_pb2.ReleaseSequenceRequest(
                session_id=session.session_id, sequence_id=sequence_id))
        self.stub.CloseSession(kvcache_pb2.CloseSessionRequest(session_id=session.session_id))

    def assert_matches_lookup(self, index):
        for prompt in self.prompts():
            looked_up = self.stub.Lookup(kvcache_pb2.LookupRequest(pool="small", tokens=prompt))
            self.assertEqual(index.cached_blocks(prompt), looked_up.num_cached_blocks, prompt)

    def test_a_router_index_built_from_the_events_answers_like_lookup(self):
        # Every message after the 20th is dropped for a while by `lossy`: it must notice.
        lossy_window = set(range(20, 45))
        reference = self.subscriber()
        lossy = self.subscriber(
            skip=lambda seq: seq in lossy_window and lossy_window.discard(seq) is None)
        time.sleep(0.3)  # ZeroMQ's slow joiner: let the SUB sockets connect
        # As llm-d does on connect: replay from 0 (AllBlocksCleared is event 0).
        reference.replay(0)
        lossy.replay(0)
        self.assertEqual(reference.last, 0)
        self.workload(200, 1)
        reference.drain()
        lossy.drain()
        self.workload(100, 2)
        reference.drain()
        lossy.drain()

        self.assertEqual(reference.index.problems, [])
        self.assertEqual(lossy.index.problems, [])
        self.assertGreater(len(reference.index.blocks), 0)
        self.assertGreaterEqual(lossy.gaps_filled, 1)
        self.assertEqual(lossy.last, reference.last)
        self.assertEqual(lossy.index.blocks, reference.index.blocks)
        self.assert_matches_lookup(reference.index)
        # Evictions happened, so removals were part of the stream.
        stats = self.stub.GetStats(kvcache_pb2.GetStatsRequest(pool="small"))
        self.assertGreater(stats.pools[0].evictions, 20)

    def test_a_replay_request_that_is_not_vllms_gets_no_answer(self):
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", b"short"])
        self.assertFalse(dealer.poll(300))
        # The socket still serves a proper request.
        dealer.send_multipart([b"", struct.pack(">Q", 0)])
        self.assertTrue(dealer.poll(10000))
        frames = dealer.recv_multipart()
        if self.LAYOUT == "topic_seq_payload":
            self.assertEqual(frames[1], TOPIC)
            frames = frames[:1] + frames[2:]
        self.assertEqual(len(frames), 3, frames)
        self.assertEqual(struct.unpack(">Q", frames[1])[0], 0)
        cleared = {"array": ["AllBlocksCleared"], "map": {"type": "AllBlocksCleared"}}
        self.assertEqual(msgpack.unpackb(frames[2])[1], [cleared[self.ENCODING]])
        dealer.close(0)


class KvEventsZmqOtherShapesTest(KvEventsZmqTest):
    """Tagged-map events, [seq, payload] replies, and a replay endpoint that names a host and
    port (no '*'): the PUB rule would connect it, and no subscriber would ever be answered."""
    ENCODING = "map"
    LAYOUT = "seq_payload"

    def replay_endpoint_for(self, directory):
        return "tcp://127.0.0.1:%d" % free_loopback_port()


class KvEventsZmqCentralizedTest(KvEventsZmqTest):
    """llm-d's centralized mode: the router's SUB binds, and the daemon's PUB endpoint, a host
    and port with no '*', is connected to it (vLLM's rule); the start-up line says so."""
    PUB_STARTUP = "PUB connecting to tcp://127.0.0.1:"

    def endpoint_for(self, directory):
        return "tcp://127.0.0.1:%d" % free_loopback_port()

    def test_a_router_index_built_from_the_events_answers_like_lookup(self):
        router = Subscriber(self.context, self.endpoint, self.replay_endpoint, bind=True)
        # The daemon's PUB retries its connection every 100 ms: wait for it to be made (the
        # ZeroMQ handshake done). The SUB sends its subscription once it processes the new
        # connection (as a router's polling loop makes it do; reading ZMQ_EVENTS does it here),
        # and until the PUB has it, it sends to no one.
        monitor = router.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.assertTrue(monitor.poll(30000), "the daemon's PUB never connected")
        router.sub.disable_monitor()
        monitor.close(0)
        router.sub.get(zmq.EVENTS)
        time.sleep(0.2)
        router.replay(0)
        self.workload(200, 1)
        router.drain()
        self.assertEqual(router.index.problems, [])
        self.assertGreater(len(router.index.blocks), 0)
        self.assertGreater(router.last, 0)
        self.assertEqual(router.gaps_filled, 0)  # every event came live
        self.assert_matches_lookup(router.index)


if __name__ == "__main__":
    unittest.main(verbosity=2)
