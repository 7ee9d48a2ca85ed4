"""A vLLM secondary offloading tier kept in the kvcache daemon (docs/engines.md, "Use with
vLLM").

vLLM's multi-tier offloading (TieringOffloadingSpec) keeps a CPU primary tier, a host region that
its GPU workers copy KV blocks into and out of, and loads each secondary tier from
`kv_connector_extra_config.secondary_tiers`: {"type": "KvCacheTier", "module_path":
"kvcache_client.vllm", ...}. The interface followed is SecondaryTierManager of
vllm/v1/kv_offload/tiering/base.py at vllm-project/vllm 041410b9b13a5e762e6bfce4a0ce39574def5919
(the factory imports `type` from `module_path` and calls it with offloading_spec,
primary_kv_view and tier_type, plus the tier's own config keys as keyword arguments).

What the tier does for the engine:
- lookup(key) answers whether the daemon has the page named by vLLM's own OffloadKey (the block
  hash and group index, 36 bytes) in any of its tiers, without blocking the scheduler: a key
  first asked is answered "retry" (None; LookupResult.RETRY in later vLLM) and queued, a thread
  sends the keys the scheduler asked for each request and KV group as one ExistsPages, in the
  order asked, and the next step's lookups find the answers (vLLM's scheduler goes on past a
  deferred key, so a whole prefix is asked in one step). Only a request's first key waits for
  its answer, briefly (first_lookup_wait_s, one round trip): an uncached prompt, most new
  requests, is then a miss in the step it arrives in. `async_lookup=False` asks the daemon on
  the scheduler's thread instead, one ExistsPages per key.
- submit_store / submit_load copy rows of the primary region (one page each) into or out of the
  daemon's pool on a worker thread: on the daemon's node through the mapped pool (reserve the
  pages, copy each row into its block, commit; acquire, copy out verifying each page's checksum,
  release), else as bytes over gRPC. get_finished() reports each job once.
- touch(keys) makes the pages the most recently used (PinPages with ttl 0).
The session is bound to a CompatibilityManifest made from vLLM's config, so pages stored under
one model configuration, dtype or parallel layout never serve another.

The engine's loop never sees an exception from here: a daemon that is down, restarting or
misconfigured makes lookups miss and jobs fail (JobResult success False, which vLLM handles as a
failed transfer), and the worker thread reconnects in the background.

Threads: vLLM calls every method from its scheduler thread (never two at once). The worker
thread owns connecting and every transfer; the lookup thread sends the queued lookups over the
connection the worker made, if any.
Importing this module needs no vLLM: with vLLM installed the tier subclasses its
SecondaryTierManager (the factory asserts that) and returns its JobResult values.
"""

import dataclasses
import hashlib
import json
import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import grpc
import numpy

from ._calls import RetryPolicy
from .client import Client
from .errors import KvCacheError
from .session import Session
from .values import CompatibilityManifest, PagePart, ParallelGeometry, PoolInfo

_log = logging.getLogger(__name__)

MAX_KEYS_PER_CALL = 4096  # the daemon's batch limit (kvcache.proto, pages)
GRPC_BATCH_BYTES = 8 << 20  # pages per put/get over gRPC: well inside the 16 MiB message limit
TIER_TYPE = "KvCacheTier"

try:  # The engine's own types when it is installed: its factory checks the base class.
    from vllm.v1.kv_offload.tiering.base import JobResult as _VllmJobResult
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager as _TierBase
except ImportError:  # No vLLM: the conformance driver, tools, type checks.
    _TierBase = object  # type: ignore[assignment,misc]
    _VllmJobResult = None

try:  # Later vLLM answers lookups with an enum; the commit followed answers True/False/None.
    from vllm.v1.kv_offload.base import LookupResult as _VllmLookupResult
    _HIT: Any = _VllmLookupResult.HIT
    _MISS: Any = _VllmLookupResult.MISS
    # "Ask again next step"; an enum without it leaves the tier only blocking lookups.
    _RETRY: Any = getattr(_VllmLookupResult, "RETRY", None)
    _CAN_DEFER = _RETRY is not None
except ImportError:
    _HIT, _MISS, _RETRY, _CAN_DEFER = True, False, None, True

try:
    from vllm.v1.kv_offload.base import RequestOffloadingContext as _RequestContext
except ImportError:
    _RequestContext = None


@dataclasses.dataclass
class JobResult:
    """vLLM's JobResult (tiering/base.py) when vLLM is not installed: a job's id and whether
    every page of it was transferred."""
    job_id: int
    success: bool


def _job_result(job_id: int, success: bool) -> Any:
    return (_VllmJobResult or JobResult)(job_id=job_id, success=success)


# ---- The manifest, from vLLM's config ----

_KV_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
              "float": "fp32", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def _dtype_name(value: Any) -> str:
    """torch.bfloat16, "bfloat16", "bf16" ... as a manifest names it; "" if unknown."""
    name = str(value).replace("torch.", "")
    return _KV_DTYPES.get(name, name if name in ("fp16", "bf16", "fp32") else "")


def _config_dict(config: Any) -> Dict[str, Any]:
    """A Hugging Face config (or a dict standing in for one) as a dict."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else dict(vars(config))


# What in a model's config changes its KV (docs/engines.md, "Engine plug-ins: the compatibility
# manifest").
_KV_CONFIG_FIELDS = ("architectures", "model_type", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "hidden_size", "rope_theta",
                     "rope_scaling", "sliding_window", "max_position_embeddings",
                     "quantization_config", "kv_lora_rank", "qk_rope_head_dim")


def manifest_from_vllm(offloading_spec: Any, page_bytes: int,
                       model_id: Optional[str] = None) -> CompatibilityManifest:
    """The manifest of the KV that the engine described by `offloading_spec` (vLLM's
    OffloadingSpec: vllm_config, gpu_block_size, block_size_factor) stores, one page per primary
    row of `page_bytes`. The digest covers the model's KV-relevant config, its revision, max
    model length and cache dtype (vllm#56311: a RoPE change must not reuse old KV). Raises
    ValueError for a KV dtype the daemon has no pool for."""
    config = offloading_spec.vllm_config
    model = config.model_config
    cache = config.cache_config
    parallel = config.parallel_config
    cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
    kv_dtype = _dtype_name(model.dtype if cache_dtype == "auto" else cache_dtype)
    if not kv_dtype:
        raise ValueError(f"kvcache tier: no kvcache pool dtype for KV dtype {cache_dtype!r} "
                         f"(model dtype {model.dtype})")
    hf = _config_dict(getattr(model, "hf_text_config", None) or getattr(model, "hf_config", None))
    relevant = {name: hf.get(name) for name in _KV_CONFIG_FIELDS}
    relevant.update(model=str(model.model), revision=getattr(model, "revision", None),
                    max_model_len=getattr(model, "max_model_len", None), cache_dtype=cache_dtype)
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).digest()
    page_tokens = int(offloading_spec.gpu_block_size[0]) * int(offloading_spec.block_size_factor)
    # One primary row holds every rank's part of a block, so the scheduler's tier is the whole
    # tensor-parallel group: its size is in the manifest, and its rank is 0.
    return CompatibilityManifest(
        model_id=model_id or str(model.model), model_config_digest=digest, kv_dtype=kv_dtype,
        page_tokens=page_tokens, parts=(PagePart("kv", page_bytes),),
        parallel=ParallelGeometry(
            tp_size=int(getattr(parallel, "tensor_parallel_size", 1)),
            pp_size=int(getattr(parallel, "pipeline_parallel_size", 1)),
            cp_size=int(getattr(parallel, "decode_context_parallel_size", 1)) *
            int(getattr(parallel, "prefill_context_parallel_size", 1))),
        key_hash_algorithm="vllm-offload-key")


# ---- The connection: a client, a session bound to the manifest, the mapped pool ----

# Codes after which the session or channel is not worth another call: reconnect.
_RECONNECT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND)


class _Connection:
    """One session with the daemon, made and closed by the tier's worker thread."""

    def __init__(self, client: Client, session: Session, pool: PoolInfo,
                 same_node: bool) -> None:
        self.client = client
        self.session = session
        self.pool = pool
        self.same_node = same_node  # False: the daemon is on another node (bytes over gRPC)

    def close(self) -> None:
        for close in (self.session.close, self.client.close):
            try:
                close()
            except Exception:  # a dead daemon's session: nothing left to release
                pass


class _PoolMismatch(Exception):
    """The daemon's pool cannot hold the engine's pages: a configuration error, not an outage."""


@dataclasses.dataclass
class _Job:
    kind: str  # "store", "load", "touch", "close", "sync" or "stop"
    job_id: int = -1
    keys: Tuple[bytes, ...] = ()
    rows: Tuple[int, ...] = ()
    done: Optional[threading.Event] = None  # "sync": set once the jobs before it finished
    connection: Optional[_Connection] = None  # "close": one the scheduler thread dropped


@dataclasses.dataclass
class _Lookup:
    """What the tier knows of one key: None until the daemon answered (or the key was marked a
    miss), and the requests that asked for it since."""
    found: Optional[bool] = None
    requests: Set[str] = dataclasses.field(default_factory=set)


class _AsyncLookups:
    """Lookups that do not hold up the scheduler. A key first asked is queued and answered None
    ("retry next step"); a thread sends what is queued, each (request, KV group)'s keys as one
    ExistsPages in the order asked, and keeps the answers until every request that asked for a
    key has finished (vLLM's AsyncLookupManager keeps them the same way, so a request's later
    steps and another request sharing the prefix get the same answer).

    ExistsPages answers how many leading keys are restorable: those are hits, the key after them
    a miss, and so is every key after that (the scheduler's prefix lookup stops at its first
    miss; a key past it answered a miss loses a hit, never serves a wrong page).

    A request's first key waits up to `first_key_wait` seconds for its answer: a prompt nothing
    is cached for (most new requests) is then a miss in the step it arrives in, at the cost of
    one round trip, instead of waiting a step for a "retry" to resolve."""

    def __init__(self, leading_hits: Callable[[Sequence[bytes]], int],
                 first_key_wait: float) -> None:
        # leading_hits(keys): how many leading keys the daemon has; raises when it cannot say.
        self._leading_hits = leading_hits
        self._first_key_wait = first_key_wait
        self._wake = threading.Condition()  # guards everything below
        self._states: Dict[bytes, _Lookup] = {}
        self._by_request: Dict[str, Set[bytes]] = {}
        self._queued: List[Tuple[str, bytes]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kvcache-vllm-lookup",
                                        daemon=True)
        self._thread.start()

    def lookup(self, key: bytes, request: str) -> Optional[bool]:
        """The daemon's answer for `key`, or None while it is to come (the key queued)."""
        with self._wake:
            first_of_request = request not in self._by_request
            known = self._states.get(key)
            if known is None:
                known = self._states[key] = _Lookup()
                self._queued.append((request, key))
                self._wake.notify_all()
            state: _Lookup = known
            state.requests.add(request)
            self._by_request.setdefault(request, set()).add(key)
            if first_of_request and state.found is None and self._first_key_wait > 0:
                self._wake.wait_for(lambda: state.found is not None, self._first_key_wait)
            return state.found

    def mark_miss(self, keys: Iterable[bytes]) -> None:
        """Answers `keys` a miss from now on: a load of them failed, so a scheduler that asked
        again would promote them again and fail again (vllm#49176's livelock)."""
        with self._wake:
            for key in keys:
                state = self._states.get(key)
                if state is not None:
                    state.found = False

    def finished(self, request: str) -> None:
        """Forgets what only `request` asked for (an answer still to come is dropped when it
        comes)."""
        with self._wake:
            for key in self._by_request.pop(request, ()):
                state = self._states.get(key)
                if state is None:
                    continue
                state.requests.discard(request)
                if not state.requests and state.found is not None:
                    del self._states[key]

    def known(self) -> int:
        """Keys with an answer kept or to come (tests: nothing outlives its requests)."""
        with self._wake:
            return len(self._states)

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        self._thread.join(timeout=60.0)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._queued or self._stopping)
                if self._stopping:
                    return
                queued, self._queued = self._queued, []
            # vLLM's key ends with its KV group's index (make_offload_key): a request's keys of
            # one group are one prefix.
            batches: Dict[Tuple[str, bytes], List[bytes]] = {}
            for request, key in queued:
                batches.setdefault((request, key[-4:]), []).append(key)
            for keys in batches.values():
                try:
                    hits = self._leading_hits(keys)
                except Exception:  # the tier logged it: misses, asked again by a new request
                    hits = 0
                with self._wake:
                    for index, key in enumerate(keys):
                        state = self._states.get(key)
                        if state is None or state.found is not None:
                            continue  # marked a miss meanwhile
                        state.found = index < hits
                        if not state.requests:
                            del self._states[key]
                    self._wake.notify_all()  # a request's first key may be waiting


class KvCacheTier(_TierBase):  # type: ignore[misc,valid-type]
    """vLLM's SecondaryTierManager over one kvcache pool. Config keys (secondary_tiers entry):
    target (the daemon: "unix:///run/kvcache/kvcache.sock" or "host:port"; default: its default
    socket), pool ("default"), client_name, session_ttl_s (how soon the daemon releases what a
    killed engine held), rpc_timeout_s (the longest one call to the daemon may take),
    retry_after_s (between reconnect attempts), max_load_ms (lower-tier loads), model_id,
    async_lookup (True: lookups answer "retry" rather than block the scheduler; False: each asks
    the daemon on the scheduler's thread, up to rpc_timeout_s), first_lookup_wait_s (async: how
    long a request's first key waits for its answer, so that an uncached prompt is a miss at
    once; 0: never)."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview,
                 tier_type: str = TIER_TYPE, *, target: Optional[str] = None,
                 pool: str = "default", client_name: str = "vllm", session_ttl_s: float = 10.0,
                 rpc_timeout_s: float = 1.0, retry_after_s: float = 1.0, max_load_ms: int = 0,
                 model_id: Optional[str] = None, async_lookup: bool = True,
                 first_lookup_wait_s: float = 0.002) -> None:
        # Set as vLLM's base class sets them, without calling it: its signature has changed
        # between vLLM versions, these attributes have not.
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = None
        # The primary region, (num_blocks, row_stride_bytes): row b is the page of block b.
        self._rows = numpy.asarray(primary_kv_view).view(numpy.uint8)
        if self._rows.ndim != 2:
            raise ValueError(f"kvcache tier: the primary view must be (blocks, row bytes), "
                             f"not shape {self._rows.shape}")
        self.page_bytes = int(self._rows.shape[1])
        self.manifest = manifest_from_vllm(offloading_spec, self.page_bytes, model_id)
        self._target = target
        self._pool_name = pool
        self._client_name = client_name
        self._session_ttl = session_ttl_s
        self._rpc_timeout = rpc_timeout_s
        self._retry_after = retry_after_s
        self._max_load_ms = max_load_ms

        self._connection: Optional[_Connection] = None  # made by the worker thread only
        self._outage_logged = False
        self._disabled: Optional[str] = None  # why the pool can never serve this engine
        self._lock = threading.Lock()  # guards _finished
        self._finished: List[Any] = []
        self._jobs: "queue.Queue[_Job]" = queue.Queue()
        self._worker: Optional[threading.Thread] = None
        if async_lookup and not _CAN_DEFER:
            _log.warning("kvcache tier: this vLLM's LookupResult has no RETRY; lookups block")
        self._lookups = (_AsyncLookups(self._leading_hits, first_lookup_wait_s)
                         if async_lookup and _CAN_DEFER else None)

    # ---- SecondaryTierManager ----

    def lookup(self, key: bytes, req_context: Any) -> Any:
        """HIT when the daemon has the page in any tier, MISS when it has not (also when it is
        not reachable: the scheduler then computes the tokens), RETRY (None) while the answer
        is on its way."""
        self._start_worker()
        connection = self._connection
        if connection is None:
            return _MISS
        if self._lookups is not None:
            found = self._lookups.lookup(bytes(key), str(getattr(req_context, "req_id", "")))
            return _RETRY if found is None else _HIT if found else _MISS
        try:
            return _HIT if self._leading_hits([bytes(key)]) == 1 else _MISS
        except Exception:  # logged by _leading_hits; never into the scheduler's loop
            return _MISS

    def submit_store(self, job_metadata: Any) -> None:
        """Queues the copy of the job's primary rows into the daemon; reported by get_finished."""
        self._submit("store", job_metadata)

    def submit_load(self, job_metadata: Any) -> None:
        """Queues the copy of the job's pages into its primary rows; reported by get_finished,
        successful only when every page came back (vLLM then drops the rows otherwise)."""
        self._submit("load", job_metadata)

    def get_finished(self) -> Iterable[Any]:
        """The jobs finished since the last call, each reported once."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def touch(self, keys: Iterable[bytes], req_context: Any) -> None:
        """Makes the pages the daemon's most recently used, on the worker thread."""
        self._start_worker()
        self._jobs.put(_Job("touch", keys=tuple(bytes(key) for key in keys)))

    def get_request_offloading_context(self, req_context: Any) -> Any:
        """Block-level offloading (vLLM's default): every block stored is cascaded here."""
        return _RequestContext() if _RequestContext is not None else None

    def request_finished(self, req_context: Any) -> None:
        """Forgets the request's lookup answers (a job holds the daemon's pages only while it
        runs)."""
        if self._lookups is not None:
            self._lookups.finished(str(getattr(req_context, "req_id", "")))

    def shutdown(self) -> None:
        """Finishes the queued jobs, stops the worker thread and closes the session (the daemon
        then releases anything still held)."""
        if self._lookups is not None:
            self._lookups.stop()
        worker = self._worker
        if worker is not None:
            self._jobs.put(_Job("stop"))
            worker.join(timeout=60.0)
            self._worker = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # Spellings of later vLLM versions of the same interface (get_finished_jobs, on_new_request,
    # on_request_finished, drain_jobs; get_tier_type of earlier ones).
    def get_finished_jobs(self) -> Iterable[Any]:
        return self.get_finished()

    def on_new_request(self, req_context: Any) -> Any:
        return self.get_request_offloading_context(req_context)

    def on_request_finished(self, req_context: Any) -> None:
        self.request_finished(req_context)

    def drain_jobs(self) -> None:
        """Blocks until every job queued so far has finished (and is reported)."""
        if self._worker is None:
            return
        done = threading.Event()
        self._jobs.put(_Job("sync", done=done))
        done.wait()

    @staticmethod
    def get_tier_type() -> str:
        return TIER_TYPE

    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
        return {}  # the daemon exports its own metrics (docs/operations.md, "Metrics")

    # ---- Beyond vLLM's interface ----

    def wait_connected(self, timeout: float) -> bool:
        """Whether the worker thread has a session within `timeout` seconds (tests, tools)."""
        self._start_worker()
        deadline = time.monotonic() + timeout
        while self._connection is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._connection is not None

    @property
    def disabled(self) -> Optional[str]:
        """Why this pool can never serve this engine (its page size, dtype or page tokens
        differ), or None."""
        return self._disabled

    # ---- The worker thread ----

    def _submit(self, kind: str, job_metadata: Any) -> None:
        self._start_worker()
        # chunk_ids: later vLLM versions' name for the same primary rows.
        rows = getattr(job_metadata, "block_ids", None)
        if rows is None:
            rows = job_metadata.chunk_ids
        self._jobs.put(_Job(kind, int(job_metadata.job_id),
                            tuple(bytes(key) for key in job_metadata.keys),
                            tuple(int(row) for row in rows)))

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="kvcache-vllm-tier",
                                            daemon=True)
            self._worker.start()

    def _run(self) -> None:
        next_connect = 0.0
        while True:
            if self._connection is None and self._disabled is None:
                if time.monotonic() >= next_connect:
                    self._connection = self._connect()
                    if self._connection is None:
                        next_connect = time.monotonic() + self._retry_after
            try:
                job = self._jobs.get(timeout=self._retry_after)
            except queue.Empty:
                continue
            if job.kind == "stop":
                return
            if job.kind == "sync":
                assert job.done is not None
                job.done.set()
                continue
            if job.kind == "close":
                assert job.connection is not None
                job.connection.close()
                continue
            if self._connection is None and self._disabled is None:
                # A job is waiting: try at once rather than at the next retry time.
                self._connection = self._connect()
            success = self._transfer(job)
            if job.kind == "load" and not success and self._lookups is not None:
                self._lookups.mark_miss(job.keys)
            if job.kind != "touch":
                with self._lock:
                    self._finished.append(_job_result(job.job_id, success))

    def _connect(self) -> Optional[_Connection]:
        client = None
        try:
            client = Client(self._target, connect_timeout=self._rpc_timeout,
                            rpc_timeout=self._rpc_timeout, retry=RetryPolicy(enabled=False))
            pool = client.describe_pool(self._pool_name).pool
            self._check_pool(pool)
            session = client.open_session(self._client_name, ttl=self._session_ttl,
                                          manifest=self.manifest)
            try:  # write_pages and read_pages_into map it again, once per session
                session.map_pool(self._pool_name).close()
                same_node = True
            except KvCacheError:  # another node's daemon, or a device pool: bytes over gRPC
                same_node = False
            _log.info("kvcache tier: connected to pool '%s' (%s)", self._pool_name,
                      "mapped" if same_node else "over gRPC")
            self._outage_logged = False
            return _Connection(client, session, pool, same_node)
        except _PoolMismatch as mismatch:
            self._disabled = str(mismatch)
            _log.error("kvcache tier disabled: %s", mismatch)
        except Exception as error:
            if not self._outage_logged:  # once per outage, not once per retry
                _log.warning("kvcache tier: daemon %s not reachable (%s); lookups miss until "
                             "it is", self._target or "(default socket)", error)
                self._outage_logged = True
        if client is not None:
            client.close()
        return None

    def _check_pool(self, pool: PoolInfo) -> None:
        layout = pool.layout
        wanted = {"block_bytes": (layout.block_bytes, self.page_bytes),
                  "block_size": (layout.block_size, self.manifest.page_tokens),
                  "dtype": (_dtype_name(layout.dtype.name.lower()), self.manifest.kv_dtype)}
        wrong = [f"{name}={have} (vLLM needs {need})"
                 for name, (have, need) in wanted.items() if have != need]
        if wrong:
            raise _PoolMismatch(f"pool '{pool.name}' has " + ", ".join(wrong))

    def _transfer(self, job: _Job) -> bool:
        connection = self._connection
        if connection is None:
            return False
        move: Callable[[_Connection, Sequence[bytes], Sequence[int]], bool] = {
            "store": self._store, "load": self._load, "touch": self._touch}[job.kind]
        batch = MAX_KEYS_PER_CALL
        if job.kind != "touch":
            # A reservation or an acquisition holds all its blocks at once: a request longer
            # than half the pool moves in parts, rather than failing whole.
            batch = max(1, min(batch, connection.pool.num_blocks // 2))
        if not connection.same_node:
            batch = max(1, min(batch, GRPC_BATCH_BYTES // self.page_bytes))
        try:
            for start in range(0, len(job.keys), batch):
                end = start + batch
                if not move(connection, job.keys[start:end], job.rows[start:end]):
                    return False
            return True
        except Exception as error:
            self._failed(connection, job.kind, error)
            return False

    def _store(self, connection: _Connection, keys: Sequence[bytes],
               rows: Sequence[int]) -> bool:
        sources = [self._rows[row] for row in rows]
        if connection.same_node:
            connection.session.write_pages(self._pool_name, keys, sources)
        else:
            connection.session.put_pages(self._pool_name, keys, sources)
        return True

    def _load(self, connection: _Connection, keys: Sequence[bytes],
              rows: Sequence[int]) -> bool:
        destinations = [self._rows[row] for row in rows]
        if connection.same_node:
            pages = connection.session.read_pages_into(self._pool_name, keys, destinations,
                                                       max_load_ms=self._max_load_ms)
            return len(pages.block_ids) == len(keys)
        got = connection.session.get_pages(self._pool_name, keys,
                                           max_load_ms=self._max_load_ms)
        for destination, page in zip(destinations, got.pages):
            destination[:] = numpy.frombuffer(page, dtype=numpy.uint8)
        return len(got.pages) == len(keys)

    def _touch(self, connection: _Connection, keys: Sequence[bytes],
               rows: Sequence[int]) -> bool:
        connection.session.pin_pages(self._pool_name, keys, ttl=0)
        return True

    def _leading_hits(self, keys: Sequence[bytes]) -> int:
        """How many leading `keys` the daemon has (the lookup thread's call); raises when it
        cannot say."""
        connection = self._connection
        if connection is None:
            return 0
        hits = 0
        for start in range(0, len(keys), MAX_KEYS_PER_CALL):
            batch = keys[start:start + MAX_KEYS_PER_CALL]
            try:
                found = connection.session.exists_pages(self._pool_name, batch).num_pages
            except Exception as error:
                self._failed(connection, "lookup", error)
                raise
            hits += found
            if found < len(batch):
                break
        return hits

    def _failed(self, connection: _Connection, what: str, error: Exception) -> None:
        """Logs a failed call; drops the connection when the daemon or the session is gone, for
        the worker thread to make another."""
        code = error.code if isinstance(error, KvCacheError) else None
        if code in _RECONNECT_CODES or connection.session.lost or connection.session.epoch_changed:
            _log.warning("kvcache tier: %s failed (%s); reconnecting", what, error)
            if self._connection is connection:
                self._connection = None
                if threading.current_thread() is self._worker:
                    connection.close()
                else:  # closing waits on the daemon: not on the scheduler's thread
                    self._jobs.put(_Job("close", connection=connection))
        else:
            _log.error("kvcache tier: %s failed: %s", what, error)
