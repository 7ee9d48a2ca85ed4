"""MappedPool: a host pool's shared memory mapped into this process, with numpy views of blocks.

A worker on the daemon's node reads and writes KV in place instead of moving bytes over gRPC,
as the C++ MappedPool (client/mapped_pool.h) does. Session.map_pool maps the POSIX shared memory
object the daemon names (a daemon with --device host) once; after that every access is a block
id: block i starts at byte i * block_bytes and holds [layer][K,V][token][kv_head][head_dim]
elements. Views are numpy arrays over the shared memory itself, not copies: a write through one
is seen by every process that maps the pool.

Element types: fp16 as numpy.float16, fp32 as numpy.float32; bf16 and fp8 (e4m3) as
ml_dtypes.bfloat16 and ml_dtypes.float8_e4m3fn when the ml_dtypes package is installed (the
`dtypes` extra; JAX's and TensorFlow's numpy types), else as numpy.uint16 and numpy.uint8, their
raw bits (numpy has no such types). `element_type` says which a pool got.

Epochs: a mapping belongs to the daemon start that described the pool. After a restart the old
shm object is unlinked and the new daemon's pool is other memory, so the session that mapped the
pool closes the mapping as soon as it sees the restart: every accessor then raises
FAILED_PRECONDITION. Views handed out before stay valid Python objects, but over the old,
orphaned memory that no other process sees (the memory goes when the last of them does): drop
them and map again through a new session.

What a process may touch: only blocks of its own open sequences, and among them only tokens it
has not committed (committed and hit blocks are shared read-only by contract). Commit after the
writes are done: the daemon publishes a block only then.

Pages (pools named by the engine's keys, Session.write_pages / read_pages_into): page(block_id)
is the whole block as bytes, part(block_id, name) one of the pool's named parts
(PoolInfo.parts); page_tensor and part_tensor are the same memory as torch tensors, for an engine
that copies to and from its device with torch.

Device pools (CUDA IPC, --device cuda:N) are not mapped by the Python client: FAILED_PRECONDITION
(use put_blocks / get_blocks_into, or the C++ MappedPool).

Thread safety: thread-compatible. Accessors may run concurrently; close() must not race them.
The bytes are shared memory, synchronized by the caller and the commit protocol.
"""

import importlib
import mmap
import os
import threading
from types import ModuleType
from typing import Any, Dict, Optional

import grpc
import numpy

from .errors import KvCacheError, invalid_argument
from .values import DType, MappingKind, PagePartInfo, PoolInfo

_NUMPY_TYPES = {DType.FLOAT16: numpy.float16, DType.FLOAT32: numpy.float32}
_RAW_BITS = {DType.BFLOAT16: numpy.uint16, DType.FP8_E4M3: numpy.uint8}
_ML_DTYPES_NAMES = {DType.BFLOAT16: "bfloat16", DType.FP8_E4M3: "float8_e4m3fn"}


def _import_ml_dtypes() -> Optional[ModuleType]:
    try:
        return importlib.import_module("ml_dtypes")
    except ImportError:
        return None


def element_type(dtype: DType, ml_dtypes: Optional[ModuleType]) -> "numpy.dtype[Any]":
    """The numpy element type of a pool's `dtype`: numpy's own for fp16/fp32; ml_dtypes' for
    bf16/fp8 when given (and it has the type), else an unsigned integer of the same width."""
    if dtype in _NUMPY_TYPES:
        return numpy.dtype(_NUMPY_TYPES[dtype])
    named = getattr(ml_dtypes, _ML_DTYPES_NAMES[dtype], None) if ml_dtypes else None
    if named is not None and numpy.dtype(named).itemsize == dtype.element_bytes:
        return numpy.dtype(named)
    return numpy.dtype(_RAW_BITS[dtype])
_SHM_DIR = "/dev/shm"  # where glibc's shm_open keeps POSIX shared memory objects


def _os_error(error: OSError, what: str) -> KvCacheError:
    message = f"{what}: {error.strerror}"
    if isinstance(error, FileNotFoundError):
        return KvCacheError(grpc.StatusCode.NOT_FOUND, message + " (the daemon that made it has "
                            "stopped or restarted: describe the pool again)")
    if isinstance(error, PermissionError):
        return KvCacheError(grpc.StatusCode.PERMISSION_DENIED, message)
    if error.errno in (12, 23, 24):  # ENOMEM, ENFILE, EMFILE
        return KvCacheError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
    return KvCacheError(grpc.StatusCode.INTERNAL, message)


class MappedPool:
    """A host pool mapped read-write. Made by Session.map_pool; close() when done."""

    def __init__(self, pool: PoolInfo, epoch: int) -> None:
        """Maps `pool` as described by a daemon of epoch `epoch`. Raises KvCacheError:
        FAILED_PRECONDITION when the pool offers no shm mapping, or the object's size is not the
        described one (another daemon start); NOT_FOUND when the object is gone;
        PERMISSION_DENIED when it belongs to another user; INVALID_ARGUMENT for an inconsistent
        description."""
        self.name = pool.name
        self.epoch = epoch
        self.layout = pool.layout
        self.num_blocks = pool.num_blocks
        self.block_bytes = pool.layout.block_bytes
        self.parts = pool.parts
        self._parts: Dict[str, PagePartInfo] = {part.name: part for part in pool.parts}
        mapping = pool.mapping
        if mapping.kind != MappingKind.SHM:
            what = ("is device memory (CUDA IPC), which the Python client does not map"
                    if mapping.kind == MappingKind.CUDA_IPC else "offers no mapping")
            raise KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"pool '{pool.name}' {what}: move its bytes with put_blocks / "
                               "get_blocks_into")
        layout = pool.layout
        expected = (layout.num_layers * 2 * layout.block_size * layout.num_kv_heads
                    * layout.head_dim * layout.dtype.element_bytes)
        if (expected == 0 or expected != layout.block_bytes or pool.num_blocks == 0
                or mapping.size_bytes // layout.block_bytes < pool.num_blocks
                or not mapping.shm_name.startswith("/") or "/" in mapping.shm_name[1:]):
            raise invalid_argument(
                f"pool '{pool.name}' is described inconsistently: {layout}, {pool.num_blocks} "
                f"blocks, shared memory '{mapping.shm_name}' of {mapping.size_bytes} bytes")
        path = _SHM_DIR + mapping.shm_name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            raise _os_error(error, f"opening shared memory {mapping.shm_name}") from None
        try:
            size = os.fstat(fd).st_size
            if size != mapping.size_bytes:
                raise KvCacheError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"shared memory {mapping.shm_name} holds {size} bytes; pool '{pool.name}' of "
                    f"epoch {epoch} should have {mapping.size_bytes}: it is not that daemon's "
                    "pool (describe the pool again)")
            # Populated now, once, as the C++ MappedPool: faulting pages in block by block later
            # costs bandwidth.
            self._mmap: Optional[mmap.mmap] = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise _os_error(error, f"mapping shared memory {mapping.shm_name}") from None
        finally:
            os.close(fd)  # the mapping keeps the object alive
        self.element_type = element_type(layout.dtype, _import_ml_dtypes())
        # Every view is a slice of this one array: [block][layer][K,V][token][kv_head][head_dim].
        self._blocks: Optional[numpy.ndarray] = numpy.frombuffer(
            self._mmap, dtype=self.element_type,
            count=pool.num_blocks * layout.block_bytes // layout.dtype.element_bytes).reshape(
                pool.num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads,
                layout.head_dim)
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self._blocks is None

    def close(self) -> None:
        """Unmaps the pool (at once if no view of it is left, else when the last one goes).
        Idempotent; Session calls it on a daemon restart."""
        with self._lock:
            blocks, self._blocks = self._blocks, None
            memory, self._mmap = self._mmap, None
        del blocks
        if memory is not None:
            try:
                memory.close()
            except BufferError:
                pass  # views are still out: the memory is unmapped once they are gone

    def __enter__(self) -> "MappedPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _array(self, block_id: int, layer: Optional[int] = None) -> numpy.ndarray:
        blocks = self._blocks
        if blocks is None:
            raise KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"pool '{self.name}' of epoch {self.epoch} is no longer mapped "
                               "(closed, or the daemon restarted): map it again through a new "
                               "session")
        if not 0 <= block_id < self.num_blocks:
            raise KvCacheError(grpc.StatusCode.OUT_OF_RANGE,
                               f"block {block_id} is past pool '{self.name}' of "
                               f"{self.num_blocks} blocks")
        if layer is None:
            return blocks[block_id]
        if not 0 <= layer < self.layout.num_layers:
            raise KvCacheError(grpc.StatusCode.OUT_OF_RANGE,
                               f"layer {layer} is past pool '{self.name}' of "
                               f"{self.layout.num_layers} layers")
        return blocks[block_id, layer]

    def block(self, block_id: int) -> numpy.ndarray:
        """Block `block_id`'s bytes: a uint8 view of block_bytes. OUT_OF_RANGE past the pool."""
        return self._array(block_id).reshape(-1).view(numpy.uint8)

    def kv(self, block_id: int) -> numpy.ndarray:
        """The whole block as elements: [layer][K=0,V=1][token][kv_head][head_dim]."""
        return self._array(block_id)

    def keys(self, block_id: int, layer: int) -> numpy.ndarray:
        """K of `layer` in block `block_id`: [token][kv_head][head_dim]. OUT_OF_RANGE for a block
        or layer past the pool."""
        return self._array(block_id, layer)[0]

    def values(self, block_id: int, layer: int) -> numpy.ndarray:
        """V of `layer` in block `block_id`: [token][kv_head][head_dim]."""
        return self._array(block_id, layer)[1]

    def page(self, block_id: int) -> numpy.ndarray:
        """The page in block `block_id`: a writable uint8 view of its block_bytes (as block()).
        OUT_OF_RANGE past the pool."""
        return self.block(block_id)

    def part(self, block_id: int, name: str) -> numpy.ndarray:
        """Part `name` of the page in block `block_id`: a writable uint8 view of the part's
        bytes. INVALID_ARGUMENT for a part the pool does not have, OUT_OF_RANGE past the
        pool."""
        part = self._parts.get(name)
        if part is None:
            raise invalid_argument(f"pool '{self.name}' has no part '{name}' (its parts: "
                                   f"{', '.join(self._parts) or 'none'})")
        return self.page(block_id)[part.offset:part.offset + part.bytes]

    def page_tensor(self, block_id: int) -> Any:
        """page(block_id) as a torch uint8 tensor over the same memory (torch.from_numpy).
        FAILED_PRECONDITION when torch is not installed."""
        return _torch().from_numpy(self.page(block_id))

    def part_tensor(self, block_id: int, name: str) -> Any:
        """part(block_id, name) as a torch uint8 tensor over the same memory."""
        return _torch().from_numpy(self.part(block_id, name))


def _torch() -> ModuleType:
    """torch, imported on first use: the mapping itself needs only numpy."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                           "torch is not installed: use page() and part(), numpy views of the "
                           "same memory") from None
