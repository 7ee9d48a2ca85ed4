"""Conformance driver of kvcache_client.sglang: the plug-in called as SGLang's HiCache calls it.

SGLang commit followed: 001067fffe33427bee0ed2f007fb7551a1d76b44 (sglang_engine.py says which
files and what each contributes). No engine is installed: sglang_engine.py builds the host pools
SGLang builds (real torch tensors, its dtypes and layouts), loads the backend as its `dynamic`
factory does and calls it with its batching, arguments and threads, against real
kvcache-manager processes (KVCACHE_BIN_DIR). Every check compares bytes: what an "engine"
stored comes back bit-identical into a fresh host pool
- in another host layout (page_first, layer_first, page_first_direct, page_head);
- after eviction from the pool into its host tier;
- after a daemon restart, from its disk tier, the plug-in reporting misses while it was down;
- in a second process (another engine instance) sharing the prefix;
- for tensor-parallel ranks: an MHA rank never finds another's pages, MLA pages are stored
  once and every rank finds them;
- for a hybrid model: a trailing-pages state part with the KV (v2 calls, the daemon's endpoint);
- on another node: pages one daemon passed down to a Redis Cluster (its cluster tier) are hits
  on a second daemon sharing the cluster;
and an instance killed mid-write and mid-read leaves nothing held.
"""

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(__file__))
import daemon as helpers  # noqa: E402  (puts the client on the path)
import sglang_engine as engine  # noqa: E402
from kvcache_client import sglang as plugin  # noqa: E402

PAGE = 16  # tokens per page; the pools below have block_size=16
POOL = "sg:layers=2:kv_heads=2:head_dim=64:block_size=16:dtype=bf16:blocks=160"
PAGE_BYTES = 16 * 1024  # of pool sg: K and V, 16 tokens, 2 layers, 2 heads of 64 bf16
HYBRID = ("hy:layers=2:kv_heads=2:head_dim=64:block_size=16:dtype=bf16:blocks=64:"
          "parts=kv/12K+mamba/4K/trailing1")


def extra(target: str, pool: str = "sg") -> Dict[str, Any]:
    """The extra config docs/engines.md's "Use with SGLang" gives, pointed at the test daemon."""
    return {"backend_name": "kvcache", "module_path": "kvcache_client.sglang",
            "class_name": "KvCacheStorage", "interface_v1": 1, "kvcache_pool": pool,
            "kvcache_target": target}


def tokens(first: int, pages: int) -> List[int]:
    return list(range(first, first + pages * PAGE))


def store(target: str, layout: str, first: int, pages: int, **config: Any) -> Dict[str, bytes]:
    """An engine that computed `pages` pages of tokens from `first` backs them up; returns
    key -> page bytes (K then V) as its host pool held them."""
    pool = engine.MHAHostPool(layout, pages=pages + 8)
    backend = engine.create_backend(engine.storage_config(extra(target), layout=layout,
                                                          **config), pool)
    try:
        keys = engine.get_hash_str(tokens(first, pages), None, PAGE)
        slots = random.Random(first).sample(range(pages + 8), pages)
        for key, slot in zip(keys, slots):
            pool.fill(slot * PAGE, int(key[:8], 16))
        stored = engine.Controller(backend, PAGE).on_thread(
            "page_backup", keys, engine.host_indices(slots, PAGE))
        assert stored == pages, f"{layout}: stored {stored} of {pages}"
        return {key: engine.page_bytes(pool.page(slot * PAGE)) for key, slot in zip(keys, slots)}
    finally:
        backend.close()


def load(target: str, layout: str, first: int, pages: int, **config: Any) -> Dict[str, bytes]:
    """A fresh engine asks for the prefix (hit query, then the transfer into host pages it
    allocated) and returns key -> page bytes for the pages it got."""
    pool = engine.MHAHostPool(layout, pages=pages + 4)
    backend = engine.create_backend(engine.storage_config(extra(target), layout=layout,
                                                          **config), pool)
    try:
        keys = engine.get_hash_str(tokens(first, pages), None, PAGE)
        controller = engine.Controller(backend, PAGE)
        hits = controller.on_thread("storage_hit_query", keys)
        slots = random.Random(first + 1).sample(range(pages + 4), hits)
        got = controller.on_thread("page_transfer", keys[:hits],
                                   engine.host_indices(slots, PAGE))
        assert got == hits, f"{layout}: {hits} hits but {got} loaded"
        return {key: engine.page_bytes(pool.page(slot * PAGE))
                for key, slot in zip(keys[:hits], slots)}
    finally:
        backend.close()


def back_up_later(controller: Any, pool: Any, first: int) -> None:
    """The engine's next request finishes: its 8 pages from token `first`, computed into host
    pages 0 to 7, are backed up. Requests finish apart (0.1 s here): back to back, on a slow
    disk, the pages they push down outran the disk tier's queue (32 stores), which refuses
    the rest (kvcache_tier_lost_evictions_total), the 40 among them."""
    keys = engine.get_hash_str(tokens(first, 8), None, PAGE)
    for slot, key in enumerate(keys):
        pool.fill(slot * PAGE, int(key[:8], 16))
    assert controller.page_backup(keys, engine.host_indices(list(range(8)), PAGE)) == 8
    time.sleep(0.1)


def test_layouts(target: str) -> None:
    pairs = [("page_first", "layer_first"), ("layer_first", "page_head"),
             ("page_head", "page_first_direct"), ("page_first_direct", "page_first")]
    for number, (writer, reader) in enumerate(pairs):
        first = 100_000 * (number + 1)
        wrote = store(target, writer, first, 20)
        read = load(target, reader, first, 20)
        assert read == wrote, f"{writer} -> {reader}: pages differ or are missing"
    print("layouts: 4 writer/reader pairs, 20 pages each, bit-identical")


def test_eviction(target: str) -> None:
    """400 pages through a pool of 160 blocks: the first ones leave the pool for its host tier
    and come back from it."""
    wrote = store(target, "page_first", 1_000_000, 400)
    read = load(target, "layer_first", 1_000_000, 128)
    first = dict(list(wrote.items())[:128])
    assert read == first, f"after eviction: {len(read)} of 128 pages back, or bytes differ"
    print("eviction: 128 pages evicted from the pool came back bit-identical")


def test_restart(bin_pool: str) -> None:
    """Stored, pushed down to the disk tier by later pages (more than the pool and its host
    tier hold), the daemon stopped (the plug-in reports misses, never raises), started again on
    the same disk tier: the pages come back from disk."""
    first = helpers.Daemon(pool=bin_pool)
    try:
        wrote = store(first.target, "page_first", 2_000_000, 40)
        pool = engine.MHAHostPool("page_first", pages=48)
        backend = engine.create_backend(engine.storage_config(extra(first.target)), pool)
        keys = list(wrote)
        # This engine's later pages, backed up 8 at a time as its requests finish, push the 40
        # out of the pool and its host tier (176 pages) down to the disk tier (the mover writes
        # it in the background).
        controller = engine.Controller(backend, PAGE)
        session, daemon_keys = backend._live()[0], [plugin.page_key(key) for key in keys]
        # A page passed down while the disk's store of it is queued is a miss for that moment
        # (daemon of 783ff9b), so only the end is checked: all 40 on disk.
        for chunk in range(60):
            if session.exists_pages("sg", daemon_keys).by_tier.disk == 40:
                break
            back_up_later(controller, pool, 2_100_000 + chunk * 1000)
        helpers.wait_until(lambda: session.exists_pages("sg", daemon_keys).by_tier.disk == 40,
                           "the 40 pages in the disk tier only")
        first.stop()
        assert controller.on_thread("storage_hit_query", keys) == 0
        assert controller.on_thread("page_transfer", keys, engine.host_indices(
            list(range(40)), PAGE)) == 0
        assert controller.on_thread("page_backup", keys, engine.host_indices(
            list(range(40)), PAGE)) == 0
        second = helpers.Daemon(pool=bin_pool, directory=first.directory)
        try:
            time.sleep(plugin._RETRY_SECONDS + 0.5)
            helpers.wait_until(lambda: controller.storage_hit_query(keys) == 40,
                               "the pages found on the restarted daemon")
            got = controller.on_thread("page_transfer", keys, engine.host_indices(
                list(range(40)), PAGE))
            assert got == 40, f"{got} of 40 pages loaded from disk"
            read = {key: engine.page_bytes(pool.page(i * PAGE)) for i, key in enumerate(keys)}
            assert read == wrote, "pages from the disk tier differ"
            backend.close()
        finally:
            second.cleanup()
    finally:
        first.cleanup()
    print("restart: misses while down, 40 pages back bit-identical from the disk tier")


def test_cluster(bin_pool: str) -> None:
    """Two nodes' daemons share a Redis Cluster: what one's pool passes down (its later pages
    push the 40 out of its 48 blocks) the other finds and loads, bit-identical."""
    cluster = helpers.RedisCluster()  # scripts/setup.sh installs redis-server: no skip
    try:
        first = helpers.Daemon("--cluster_tier", cluster.target, pool=bin_pool)
        second = helpers.Daemon("--cluster_tier", cluster.target, pool=bin_pool)
        try:
            wrote = store(first.target, "page_first", 7_000_000, 40)
            keys = list(wrote)
            pool = engine.MHAHostPool("page_first", pages=48)
            other_node = engine.create_backend(engine.storage_config(extra(second.target)),
                                               pool)
            writer = engine.create_backend(engine.storage_config(extra(first.target)), pool)
            controller = engine.Controller(writer, PAGE)
            for chunk in range(60):
                if engine.Controller(other_node, PAGE).storage_hit_query(keys) == 40:
                    break
                back_up_later(controller, pool, 7_100_000 + chunk * 1000)
            writer.close()
            other_node.close()
            read = load(second.target, "layer_first", 7_000_000, 40)
            assert read == wrote, f"{len(read)} of 40 pages from the cluster, or bytes differ"
        finally:
            second.cleanup()
            first.cleanup()
    finally:
        cluster.stop()
    print("cluster: 40 pages one daemon passed down were hits on another, bit-identical")


def test_tensor_parallel(target: str) -> None:
    wrote = store(target, "page_first", 3_000_000, 10, tp_rank=0, tp_size=2)
    other = load(target, "page_first", 3_000_000, 10, tp_rank=1, tp_size=2)
    assert other == {}, "an MHA rank found another rank's pages"
    same = load(target, "page_first", 3_000_000, 10, tp_rank=0, tp_size=2)
    assert same == wrote
    keys = engine.get_hash_str(tokens(3_100_000, 10), None, PAGE)
    backends, pools = [], []
    for rank in (0, 1):
        pool = engine.MLAHostPool("page_first" if rank == 0 else "layer_first", pages=12)
        pools.append(pool)
        backends.append(engine.create_backend(engine.storage_config(
            extra(target), tp_rank=rank, tp_size=2, mla=True), pool))
    try:
        for i, key in enumerate(keys):
            pools[0].fill(i * PAGE, int(key[:8], 16))
        indices = engine.host_indices(list(range(10)), PAGE)
        # The controller skips the backup on MLA ranks other than 0 (backup_skip); both here.
        assert engine.Controller(backends[0], PAGE).page_backup(keys, indices) == 10
        assert all(backends[1].batch_set_v1(keys, indices))
        reader = engine.Controller(backends[1], PAGE)
        assert reader.on_thread("storage_hit_query", keys) == 10
        assert reader.on_thread("page_transfer", keys, indices) == 10
        for i in range(10):
            assert engine.page_bytes(pools[1].page(i * PAGE)) == engine.page_bytes(
                pools[0].page(i * PAGE)), f"MLA page {i} differs on rank 1"
    finally:
        for backend in backends:
            backend.close()
    print("tensor parallel: MHA ranks apart; MLA stored once (rank 0), rank 1 reads it")


def test_hybrid(target: str) -> None:
    """A hybrid model's backup as HybridCacheController._page_backup makes it: the state pool
    with batch_set_v2 (its page 3 only: trailing), then the KV with batch_set_v1."""
    kv_pool = engine.MHAHostPool("page_first", pages=8, head_dim=48)  # 12 KiB pages: part kv
    state_pool = engine.StateHostPool(slots=4)
    config = engine.storage_config(extra(target, pool="hy"))
    backend = engine.create_backend(config, kv_pool)
    backend.register_mem_host_pool_v2(kv_pool, "kv")
    backend.register_mem_host_pool_v2(state_pool, "mamba")
    try:
        keys = engine.get_hash_str(tokens(4_000_000, 5), None, PAGE)
        for i, key in enumerate(keys):
            kv_pool.fill(i * PAGE, int(key[:8], 16))
        state_pool.buffer[1].copy_(engine.pattern(7, (4096,), engine.torch.uint8))
        state = engine.PoolTransfer("mamba", host_indices=engine.torch.tensor([1]),
                                    keys=[keys[2]], hit_policy="trailing_pages")
        assert backend.batch_set_v2([state]) == {"mamba": [True]}
        indices = engine.host_indices(list(range(5)), PAGE)
        assert all(backend.batch_set_v1(keys, indices))
        probe = engine.PoolTransfer("mamba", keys=[keys[-1]], hit_policy="trailing_pages")
        result = backend.batch_exists_v2(keys, [probe])
        assert result.kv_hit_pages == 3, f"endpoint {result.kv_hit_pages}, want 3 (state at 3)"
        fresh_kv = engine.MHAHostPool("layer_first", pages=8, head_dim=48)
        fresh_state = engine.StateHostPool(slots=4)
        reader = engine.create_backend(config, fresh_kv)
        reader.register_mem_host_pool_v2(fresh_kv, "kv")
        reader.register_mem_host_pool_v2(fresh_state, "mamba")
        got = reader.batch_get_v2([
            engine.PoolTransfer("kv", host_indices=engine.host_indices([4, 5, 6], PAGE),
                                keys=keys[:3]),
            engine.PoolTransfer("mamba", host_indices=engine.torch.tensor([3]), keys=[keys[2]],
                                hit_policy="trailing_pages")])
        assert got == {"kv": [True] * 3, "mamba": [True]}, got
        for i in range(3):
            assert engine.page_bytes(fresh_kv.page((4 + i) * PAGE)) == engine.page_bytes(
                kv_pool.page(i * PAGE)), f"hybrid KV page {i} differs"
        assert engine.page_bytes(fresh_state.buffer[3]) == engine.page_bytes(
            state_pool.buffer[1]), "state part differs"
        reader.close()
    finally:
        backend.close()
    print("hybrid: KV + trailing state part, endpoint 3 of 5, both bit-identical")


def test_two_instances(target: str) -> None:
    """Another process (a second engine) stores the prefix and more; this one reads it all."""
    shared = store(target, "page_first", 5_000_000, 12)
    child = subprocess.run([sys.executable, __file__, "child-store", target, "5000000", "30"],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    read = load(target, "page_head", 5_000_000, 30)
    assert len(read) == 30 and all(read[key] == page for key, page in shared.items())
    print("two instances: the second extended the shared 12-page prefix to 30; all read back")


def test_killed(bin_pool: str) -> None:
    """An instance killed (SIGKILL) holding a reservation and pinned pages: once its lease
    ends, nothing is referenced and nothing half-written is published."""
    daemon = helpers.Daemon("--session_ttl", "1s", pool=bin_pool)
    try:
        child = subprocess.Popen([sys.executable, __file__, "child-hold", daemon.target],
                                 stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline() if child.stdout else ""
        assert line.strip() == "held", f"child said {line!r}"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        client = daemon.client()
        helpers.wait_until(lambda: client.describe_pool("sg").counts.referenced == 0,
                           "the killed instance's blocks released")
        keys = engine.get_hash_str(tokens(6_000_000, 15), None, PAGE)
        found = load(daemon.target, "page_first", 6_000_000, 15)
        assert list(found) == keys[:10], f"{len(found)} pages found, want the 10 committed"
        client.close()
    finally:
        daemon.cleanup()
    print("killed instance: nothing held, the uncommitted reservation never published")


def child_hold(target: str) -> None:
    """Stores 10 pages, then reserves 5 more (never written) and pins the 10, and waits."""
    store(target, "page_first", 6_000_000, 10)
    pool = engine.MHAHostPool("page_first", pages=16)
    backend = engine.create_backend(engine.storage_config(extra(target)), pool)
    keys = [plugin.page_key(k) for k in engine.get_hash_str(tokens(6_000_000, 15), None, PAGE)]
    session = backend._live()[0]
    session.reserve_pages("sg", keys[10:])
    session.acquire_pages("sg", keys[:10])
    print("held", flush=True)
    time.sleep(300)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child-store":
        store(sys.argv[2], "layer_first", int(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "child-hold":
        child_hold(sys.argv[2])
        return
    assert helpers.BIN_DIR, "KVCACHE_BIN_DIR must name the daemon's directory"
    with tempfile.TemporaryDirectory(prefix="kvsg-") as disk:
        tiered = f"{POOL}:host_tier=8MiB:disk_tier={disk}/sg.tier:32MiB"
        daemon = helpers.Daemon(pool=f"{tiered},{HYBRID}")
        try:
            test_layouts(daemon.target)
            test_eviction(daemon.target)
            test_tensor_parallel(daemon.target)
            test_hybrid(daemon.target)
            test_two_instances(daemon.target)
        finally:
            daemon.cleanup()
        test_restart(f"{POOL}:host_tier={16 * PAGE_BYTES}:disk_tier={disk}/restart.tier:32MiB")
    test_killed(POOL)
    test_cluster(POOL.replace("blocks=160", "blocks=48"))
    print("sglang plug-in conformance: all checks passed")


if __name__ == "__main__":
    main()
