"""KvCacheError: the one exception every kvcache_client call raises.

It carries a gRPC status code: the daemon's, passed on unchanged (see the list in
proto/kvcache/v1/kvcache.proto), or one the client decides locally with the same meaning as the
C++ client (client/kv_cache_client.h): INVALID_ARGUMENT for unusable options or input,
UNAVAILABLE when the daemon cannot be reached, FAILED_PRECONDITION for a call that needs an open
session and after a daemon restart, OUT_OF_RANGE for a destination too small or a block past a
mapped pool, DATA_LOSS for received bytes that fail their checksum. Messages never carry a bearer
token or key material.
"""

import numbers
import sys
from typing import Any, Callable, List, Sequence, TypeVar, Union

import grpc

M = TypeVar("M")
# What token_ids returns and requests take: a sequence of ints, checked by protobuf as it copies.
TokenIds = Union[List[int], Sequence[int]]
_MAX_TOKEN = (1 << 32) - 1

EPOCH_METADATA_KEY = "kvcache-epoch"  # common/rpc/grpc_status.h: the epoch on an error's trailers


class KvCacheError(Exception):
    """A failed call: `code` (a grpc.StatusCode) and `message`.

    Catch it and branch on `code`, e.g. `grpc.StatusCode.RESOURCE_EXHAUSTED` to back off, or
    `grpc.StatusCode.FAILED_PRECONDITION` after a restart to open a new session and recompute.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, call: str, error: grpc.RpcError) -> "KvCacheError":
        """The daemon's (or gRPC's) status of a failed call, named after `call`."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, f"{call}: {details}")


def epoch_from_trailers(error: grpc.RpcError) -> int:
    """The daemon's epoch from a failed call's trailing metadata; 0 when absent."""
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # an RpcError that is not a call (e.g. raised before the call started)
        return 0
    for key, value in trailers:
        if key == EPOCH_METADATA_KEY:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def invalid_argument(message: str) -> KvCacheError:
    return KvCacheError(grpc.StatusCode.INVALID_ARGUMENT, message)


def token_ids(call: str, tokens: Any) -> TokenIds:
    """`tokens` as protobuf takes them for a repeated uint32 field, without a Python loop: a
    list or other sized sequence of ints as it is (protobuf range-checks each one in C as it
    copies them into the request, and make_request names the first bad one), a numpy integer
    array checked with one vectorized min/max and passed as a uint32 memoryview, an iterator as
    a list. INVALID_ARGUMENT for a numpy
    array that is not 1-D integers or holds a value outside [0, 2**32)."""
    numpy = sys.modules.get("numpy")  # only an array needs it, and an array brought it in
    if numpy is not None and isinstance(tokens, numpy.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise invalid_argument(f"{call}: tokens must be a 1-D integer array, not "
                                   f"{tokens.ndim}-D {tokens.dtype}")
        if tokens.size and tokens.dtype != numpy.uint32 and (
                int(tokens.min()) < 0 or int(tokens.max()) > _MAX_TOKEN):
            bad = int(numpy.flatnonzero((tokens < 0) | (tokens > _MAX_TOKEN))[0])
            raise invalid_argument(f"{call}: token {bad} is {tokens[bad]}; token ids are uint32")
        # As a view of native uint32 (no copy when it already is one): protobuf reads its
        # items as Python ints, several times faster than numpy scalars, without a list.
        return memoryview(numpy.ascontiguousarray(tokens, dtype=numpy.uint32))
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
        try:
            return list(tokens)  # an iterator or generator: read once
        except TypeError:
            raise invalid_argument(f"{call}: tokens must be a sequence of integers, not "
                                   f"{type(tokens).__name__}") from None
    return tokens


def _token_error(call: str, tokens: Any) -> KvCacheError:
    """The precise error for tokens protobuf refused: the first that is not an integer in
    [0, 2**32). Runs only once a request has failed, so it may loop in Python."""
    for index, token in enumerate(tokens):
        if not isinstance(token, numbers.Integral):
            return invalid_argument(f"{call}: token {index} is a {type(token).__name__}; token "
                                    "ids are uint32")
        if not 0 <= int(token) <= _MAX_TOKEN:
            return invalid_argument(f"{call}: token {index} is {token}; token ids are uint32")
    return invalid_argument(f"{call}: tokens must be a sequence of integers")


def make_request(call: str, message_type: Callable[..., M], **fields: Any) -> M:
    """message_type(**fields), built in one call (protobuf checks every field, a long token list
    included, in C). A field of the wrong type or range (a str salt, a negative id) is answered
    INVALID_ARGUMENT naming the field and the type given, never its value (a salt narrows sharing
    and need not be shown); bad tokens name the first bad one."""
    try:
        return message_type(**fields)
    except (TypeError, ValueError):
        pass  # find which field, field by field
    for name, value in fields.items():
        try:
            message_type(**{name: value})
        except (TypeError, ValueError) as error:
            if name == "tokens":
                raise _token_error(call, value) from None
            problem = "is out of range" if isinstance(error, ValueError) else "has the wrong type"
            raise invalid_argument(f"{call}: {name} ({type(value).__name__}) {problem}") from None
    # Each field alone is fine: protobuf refused them together (no such message today).
    raise invalid_argument(f"{call}: the request's fields do not fit together")
