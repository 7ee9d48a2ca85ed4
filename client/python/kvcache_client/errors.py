"""KvCacheError: the one exception every kvcache_client call raises.

It carries a gRPC status code: the daemon's, passed on unchanged (see the list in
proto/kvcache/v1/kvcache.proto), or one the client decides locally with the same meaning as the
C++ client (client/kv_cache_client.h): INVALID_ARGUMENT for unusable options or input,
UNAVAILABLE when the daemon cannot be reached, FAILED_PRECONDITION for a call that needs an open
session and after a daemon restart, OUT_OF_RANGE for a destination too small or a block past a
mapped pool, DATA_LOSS for received bytes that fail their checksum. Messages never carry a bearer
token or key material.
"""

import grpc

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


def check_tokens(call: str, tokens: object) -> list:
    """`tokens` as a list of ints in [0, 2**32); INVALID_ARGUMENT naming the first bad one."""
    try:
        values = [int(token) for token in tokens]  # type: ignore[union-attr]
    except (TypeError, ValueError) as error:
        raise invalid_argument(f"{call}: tokens must be a sequence of integers ({error})") from None
    for index, value in enumerate(values):
        if not 0 <= value < 1 << 32:
            raise invalid_argument(f"{call}: token {index} is {value}; token ids are uint32")
    return values



def make_request(call: str, message_type: type, **fields: object) -> object:
    """message_type(**fields), with a field of the wrong type or range (a str salt, a negative
    id) answered INVALID_ARGUMENT naming the field and the type given, never its value (a salt
    narrows sharing and need not be shown)."""
    message = message_type()
    for name, value in fields.items():
        try:
            if isinstance(value, (list, tuple)):
                getattr(message, name).extend(value)
            else:
                setattr(message, name, value)
        except (TypeError, ValueError) as error:
            problem = "is out of range" if isinstance(error, ValueError) else "has the wrong type"
            raise invalid_argument(f"{call}: {name} ({type(value).__name__}) {problem}") from None
    return message
