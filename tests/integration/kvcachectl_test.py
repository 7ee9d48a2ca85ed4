"""kvcachectl against a real kvcache-manager: every command as a table, JSON and YAML, the values
checked against a workload driven by kvcache-test-client, the events stream's resume points, and
the exit codes scripts branch on, failing at once with the reason when no daemon answers, --watch,
--no-headers, version and the bash completion.

Needs KVCACHE_BIN_DIR (kvcache-manager, kvcache-test-client, kvcachectl). Standard library only,
and PyYAML where present.
Every wait is bounded; the bounds are generous so a loaded machine does not fail the test.
"""

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import yaml  # Debian's python3-yaml; the YAML cases skip without it
except ImportError:
    yaml = None

BIN_DIR = os.environ.get("KVCACHE_BIN_DIR", "")
POOL_BLOCKS = 64
BLOCK_SIZE = 16  # the daemon's default pool layout
START_BOUND = 20.0
COMMAND_BOUND = 30.0
RESUME_RE = re.compile(r"resume with --from (\d+) --epoch (\d+)")

# The workload: prompt A is computed and committed (2 full blocks), then opened again (a hit);
# a long-running client holds prompt B open.
PROMPT_A_FIRST, PROMPT_A_TOKENS = 1000, 40
PROMPT_B_FIRST, PROMPT_B_TOKENS = 5000, 20


def binary(name):
    return os.path.join(BIN_DIR, name)


def tokens(first, count):
    return list(range(first, first + count))


class Daemon:
    """kvcache-manager on a Unix socket in `directory`."""

    def __init__(self, directory):
        self.socket = os.path.join(directory, "kv.sock")
        self.target = "unix://" + self.socket
        self.log = open(os.path.join(directory, "daemon.log"), "ab")
        # One pool from --pool, the other from --pools_file (its pools come after --pool's:
        # test_pools sees them in that order).
        pools_file = os.path.join(directory, "pools.json")
        with open(pools_file, "w") as f:
            json.dump({"pools": [{"name": "tiered", "blocks": 8, "host_tier": "1MiB"}]}, f)
        args = [binary("kvcache-manager"), "--listen", self.target,
                "--pool", "default:blocks=%d" % POOL_BLOCKS, "--pools_file", pools_file]
        # The health service on a TCP port of its own too, where this build has the flag.
        help_text = subprocess.run([binary("kvcache-manager"), "--help"], capture_output=True,
                                   text=True, timeout=COMMAND_BOUND).stdout
        with_health_port = "--health_listen" in help_text
        if with_health_port:
            args += ["--health_listen", "127.0.0.1:0"]
        self.health_target = None  # HOST:PORT of that port
        self.terminated = False
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_BOUND
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("kvcache-manager exited with %d" % self.process.returncode)
            if with_health_port and self.health_target is None:
                with open(os.path.join(directory, "daemon.log")) as log:
                    found = re.search(r"health on (\S+:\d+)", log.read())
                self.health_target = found.group(1) if found else None
            if (os.path.exists(self.socket) and ctl(self.target, "health").returncode == 0 and
                    (self.health_target is not None or not with_health_port)):
                return
            time.sleep(0.1)
        raise RuntimeError("kvcache-manager did not serve within %ss" % START_BOUND)

    def terminate(self):
        """SIGTERM without waiting: the daemon drains, then exits."""
        self.process.send_signal(signal.SIGTERM)
        self.terminated = True

    def stop(self):
        """SIGTERM, and waits for the exit: the daemon removes its socket as it goes, so a new
        one must not start on the same path before."""
        if self.process.poll() is None:
            if not self.terminated:
                self.terminate()
            self.process.wait(timeout=COMMAND_BOUND)
        self.log.close()


def ctl(target, *args, stdin=None, timeout=COMMAND_BOUND):
    """Runs kvcachectl --target TARGET ARGS...; returns the CompletedProcess (text)."""
    return subprocess.run([binary("kvcachectl"), "--target", target] + list(args),
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def client(target, action, first, count, *extra):
    """kvcache-test-client's result line as a dict (it must exit 0)."""
    done = subprocess.run([binary("kvcache-test-client"), target, action, "default", str(count),
                           str(first)] + list(extra),
                          capture_output=True, text=True, timeout=COMMAND_BOUND)
    if done.returncode != 0:
        raise RuntimeError("kvcache-test-client %s: %s" % (action, done.stderr))
    return result_fields(done.stdout)


def result_fields(text):
    for line in text.splitlines():
        if line.startswith("result "):
            return dict(field.split("=", 1) for field in line.split()[1:])
    raise RuntimeError("no result line in %r" % text)


def resume_point(stderr):
    """(from, epoch) of the last "resume with" line."""
    matches = RESUME_RE.findall(stderr)
    if not matches:
        raise AssertionError("no resume line in %r" % stderr)
    return int(matches[-1][0]), int(matches[-1][1])


class Watcher:
    """kvcachectl --json events --follow in the background; its stdout read on a thread, so each
    wait for a line is bounded."""

    def __init__(self, target):
        self.process = subprocess.Popen(
            [binary("kvcachectl"), "--target", target, "--json", "events", "--follow"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output

    def next_event(self):
        """The next event; fails the test if none comes within COMMAND_BOUND."""
        try:
            line = self.lines.get(timeout=COMMAND_BOUND)
        except queue.Empty:
            raise AssertionError("no event from kvcachectl within %ss" % COMMAND_BOUND)
        if line is None:
            raise AssertionError("kvcachectl stopped: %s" % self.process.stderr.read())
        return json.loads(line)

    def interrupt(self):
        """SIGINT, as an operator's ^C; returns (exit code, stderr)."""
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=COMMAND_BOUND)
        finally:
            self.close()
        return self.process.returncode, self.stderr

    def close(self):
        """Kills kvcachectl if it still runs, and keeps what it wrote on stderr."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=COMMAND_BOUND)
        if not self.process.stderr.closed:
            self.stderr = self.process.stderr.read()
            self.process.stderr.close()
            self.process.stdout.close()


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class KvcachectlTest(unittest.TestCase):
    """One daemon and one workload for the read-only commands."""

    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="kvcachectl_test.")
        cls.daemon = Daemon(cls.directory.name)
        cls.target = cls.daemon.target
        cls.committed = client(cls.target, "compute-and-commit", PROMPT_A_FIRST, PROMPT_A_TOKENS)
        cls.reopened = client(cls.target, "open-and-report", PROMPT_A_FIRST, PROMPT_A_TOKENS)
        cls.holder = subprocess.Popen(
            [binary("kvcache-test-client"), cls.target, "hold-and-hang", "default",
             str(PROMPT_B_TOKENS), str(PROMPT_B_FIRST), "30000"],
            stdout=subprocess.PIPE, text=True)
        cls.held = result_fields(cls.holder.stdout.readline())

    @classmethod
    def tearDownClass(cls):
        cls.holder.kill()
        cls.holder.wait(timeout=COMMAND_BOUND)
        cls.holder.stdout.close()
        cls.daemon.stop()
        cls.directory.cleanup()

    def run_ok(self, *args, stdin=None):
        done = ctl(self.target, *args, stdin=stdin)
        self.assertEqual(done.returncode, 0, "kvcachectl %s: %s" % (" ".join(args), done.stderr))
        return done

    def table(self, *args, stdin=None):
        """The table's rows as lists of cells, header first (cells never hold blanks)."""
        out = self.run_ok(*args, stdin=stdin).stdout
        sys.stderr.write("\n$ kvcachectl %s\n%s" % (" ".join(args), out))
        return [line.split() for line in out.splitlines() if line.strip()]

    def document(self, *args, stdin=None):
        return json.loads(self.run_ok("--json", *args, stdin=stdin).stdout)

    def test_workload_hit(self):
        self.assertEqual(self.reopened["cached"], str(2 * BLOCK_SIZE))

    def test_pools(self):
        rows = self.table("pools")
        self.assertEqual(rows[0][:4], ["NAME", "MODEL", "BLOCKS", "BLOCK_SIZE"])
        self.assertEqual(rows[1][0], "default")
        self.assertEqual(rows[1][2:4], [str(POOL_BLOCKS), str(BLOCK_SIZE)])

        pools = self.document("pools")["pools"]
        self.assertEqual([pool["name"] for pool in pools], ["default", "tiered"])
        pool = pools[0]
        self.assertEqual(pool["num_blocks"], POOL_BLOCKS)
        self.assertEqual(pool["block_size"], BLOCK_SIZE)
        self.assertEqual(pool["memory_kind"], "host")
        self.assertEqual(pool["hash_algorithm"], "xxh3_128")
        self.assertRegex(pool["layout"]["fingerprint"], r"^[0-9a-f]{16}$")
        counts = pool["counts"]
        self.assertEqual(counts["free"] + counts["evictable"] + counts["referenced"], POOL_BLOCKS)
        self.assertGreaterEqual(counts["referenced"], 1)  # the holder's sequence
        self.assertEqual(pool["mapping"]["kind"], "shm")
        # A pool declared without parts has the one part "kv", the whole page.
        self.assertEqual(pool["parts"], [{"name": "kv", "offset": 0, "bytes": pool["block_bytes"],
                                          "hit_policy": "all_pages", "trailing_pages": 0}])
        self.assertEqual(rows[0][5], "PARTS")
        self.assertEqual(rows[1][5], "kv/%dK" % (pool["block_bytes"] // 1024))

    def test_describe(self):
        rows = self.table("describe", "--pool", "default")
        self.assertEqual(rows[0][:2], ["NAME", "MODEL"])
        self.assertEqual(rows[1][0], "default")
        part_header = rows.index(["PART", "OFFSET", "BYTES", "HIT_POLICY", "TRAILING_PAGES"])
        self.assertEqual(rows[part_header + 1][:4], ["kv", "0", rows[part_header + 1][2],
                                                     "all_pages"])
        described = self.document("describe", "--pool", "default")
        self.assertEqual(described, self.document("pools")["pools"][0] | {
            "counts": described["counts"]})  # the counts may move between the two calls
        self.assertEqual(int(rows[part_header + 1][2]), described["block_bytes"])
        self.assertIsInstance(described["manifests"], list)
        done = ctl(self.target, "describe", "--pool", "nope")
        self.assertRegex(done.stderr, r"^kvcachectl: describe: NOT_FOUND: .+\n$")

    def test_stats(self):
        rows = self.table("stats")
        self.assertEqual(rows[0][:5], ["POOL", "TENANT", "PROMPT_TOKENS", "HIT_TOKENS", "HIT_RATIO"])
        self.assertEqual(rows[1][0], "default")
        self.assertEqual(rows[-1][:2], ["open", "sessions:"])

        stats = self.document("stats", "--pool", "default")
        self.assertGreaterEqual(stats["open_sessions"], 1)
        pool = stats["pools"][0]
        self.assertEqual(pool["pool"], "default")
        self.assertGreaterEqual(pool["prompt_tokens"], 2 * PROMPT_A_TOKENS + PROMPT_B_TOKENS)
        self.assertGreaterEqual(pool["hit_tokens"], 2 * BLOCK_SIZE)
        self.assertAlmostEqual(pool["hit_ratio"], pool["hit_tokens"] / pool["prompt_tokens"])
        self.assertGreaterEqual(pool["published_blocks"], 2)
        self.assertGreaterEqual(pool["open_sequences"], 1)
        self.assertEqual(sum(pool["counts"].values()), POOL_BLOCKS)
        self.assertEqual(pool["tiers"], [])  # no host_tier on this pool
        tiered = self.document("stats", "--pool", "tiered")["pools"][0]
        self.assertEqual([tier["tier"] for tier in tiered["tiers"]], ["host"])
        self.assertEqual(tiered["tiers"][0]["capacity_bytes"], 1 << 20)
        self.assertEqual(tiered["tiers"][0]["records"], 0)

    def test_sessions(self):
        rows = self.table("sessions")
        self.assertEqual(rows[0], ["ID", "TENANT", "PRINCIPAL", "CLIENT", "TTL", "EXPIRES_IN",
                                   "SEQUENCES"])
        self.assertIn(self.held["session"], [row[0] for row in rows[1:]])

        sessions = self.document("sessions")["sessions"]
        held = [s for s in sessions if s["session_id"] == self.held["session"]]
        self.assertEqual(len(held), 1, sessions)
        self.assertEqual(held[0]["client_name"], "hold-and-hang")
        self.assertEqual(held[0]["tenant"], "default")
        self.assertEqual(held[0]["ttl_ms"], 30000)
        self.assertGreater(held[0]["expires_in_ms"], 0)
        self.assertEqual(held[0]["open_sequences"], 1)
        self.assertTrue(held[0]["principal"].startswith("uid:"))

    def test_lookup(self):
        prompt = " ".join(map(str, tokens(PROMPT_A_FIRST, PROMPT_A_TOKENS)))
        rows = self.table("lookup", "--pool", "default", stdin=prompt)
        self.assertEqual(rows[0], ["POOL", "TOKENS", "CACHED_BLOCKS", "CACHED_TOKENS"])
        self.assertEqual(rows[1], ["default", str(PROMPT_A_TOKENS), "2", str(2 * BLOCK_SIZE)])

        # A file, comma separated, across lines.
        path = os.path.join(self.directory.name, "prompt.txt")
        with open(path, "w") as file:
            file.write(",\n".join(map(str, tokens(PROMPT_A_FIRST, PROMPT_A_TOKENS))) + "\n")
        found = self.document("lookup", "--pool", "default", "--tokens_file", path)
        self.assertEqual(found, {"pool": "default", "num_tokens": PROMPT_A_TOKENS,
                                 "num_cached_blocks": 2, "num_cached_tokens": 2 * BLOCK_SIZE})

        # Another salt, another cache: nothing.
        salted = self.document("lookup", "--pool", "default", "--salt", "other", "--tokens_file",
                               "-", stdin=prompt)
        self.assertEqual(salted["num_cached_blocks"], 0)

    def test_events_from_the_start(self):
        rows = self.table("events")
        self.assertEqual(rows[0][:3], ["SEQ", "TIME", "KIND"])
        self.assertEqual(rows[1][0], "0")
        self.assertEqual(rows[1][2], "AllBlocksCleared")
        self.assertIn("BlocksStored", [row[2] for row in rows[2:]])

        done = self.run_ok("--json", "events")
        events = json_lines(done.stdout)
        self.assertEqual(events[0]["sequence"], 0)
        self.assertEqual(events[0]["kind"], "AllBlocksCleared")
        stored = [e for e in events if e["kind"] == "BlocksStored"]
        # Prompt A's 2 full blocks, published by its commit.
        self.assertEqual(stored[0]["pool"], "default")
        self.assertEqual(stored[0]["tenant"], "default")
        self.assertEqual(stored[0]["medium"], "CPU")
        self.assertEqual(stored[0]["num_blocks"], 2)
        self.assertEqual(stored[0]["block_size"], BLOCK_SIZE)
        self.assertIsNone(stored[0]["parent_hash"])
        self.assertRegex(stored[0]["first_hash"], r"^[0-9a-f]{16}$")
        self.assertEqual(stored[0]["hashes"][0], stored[0]["first_hash"])
        sequences = [e["sequence"] for e in events]
        self.assertEqual(sequences, sorted(set(sequences)))
        # The resume point is past everything printed.
        next_sequence, epoch = resume_point(done.stderr)
        self.assertGreater(next_sequence, sequences[-1])
        self.assertNotEqual(epoch, 0)

    def test_events_from_resumes_without_repeating(self):
        everything = json_lines(self.run_ok("--json", "events").stdout)
        # From just after the first event: all but it, nothing twice.
        later = json_lines(self.run_ok("--json", "events", "--from", "1").stdout)
        self.assertEqual(later, everything[1:])

        # --limit stops after one event and says where to go on.
        first = self.run_ok("--json", "events", "--limit", "1")
        self.assertEqual(json_lines(first.stdout), everything[:1])
        self.assertEqual(resume_point(first.stderr)[0], 1)

        # Caught up: nothing more, the same resume point.
        done = self.run_ok("--json", "events")
        next_sequence, epoch = resume_point(done.stderr)
        caught_up = self.run_ok("--json", "events", "--from", str(next_sequence), "--epoch",
                                str(epoch))
        self.assertEqual(json_lines(caught_up.stdout), [])
        self.assertEqual(resume_point(caught_up.stderr), (next_sequence, epoch))

        # A new commit: exactly its event, from that resume point.
        client(self.target, "compute-and-commit", 9000, 2 * BLOCK_SIZE)
        new = json_lines(self.run_ok("--json", "events", "--from", str(next_sequence), "--epoch",
                                     str(epoch)).stdout)
        self.assertEqual(len(new), 1, new)
        self.assertEqual(new[0]["kind"], "BlocksStored")
        self.assertGreaterEqual(new[0]["sequence"], next_sequence)
        self.assertEqual(new[0]["num_blocks"], 2)

    def test_events_follow_streams_until_interrupted(self):
        history = len(json_lines(self.run_ok("--json", "events").stdout))
        watcher = Watcher(self.target)
        try:
            for _ in range(history):
                watcher.next_event()
            client(self.target, "compute-and-commit", 7000, 3 * BLOCK_SIZE)
            event = watcher.next_event()
            self.assertEqual(event["kind"], "BlocksStored")
            self.assertEqual(event["num_blocks"], 3)
            code, stderr = watcher.interrupt()
        finally:
            watcher.close()
        self.assertEqual(code, 0, stderr)
        self.assertEqual(resume_point(stderr)[0], event["sequence"] + 1)

    def test_health(self):
        if self.daemon.health_target is not None:
            over_tcp = ctl(self.daemon.health_target, "health")
            self.assertEqual((over_tcp.returncode, over_tcp.stdout), (0, "SERVING\n"),
                             over_tcp.stderr)
        done = self.run_ok("health")
        self.assertEqual(done.stdout, "SERVING\n")
        self.assertEqual(self.document("health"), {"service": "", "status": "SERVING"})
        self.assertEqual(self.run_ok("health", "--service", "kvcache.v1.KvCache").stdout,
                         "SERVING\n")
        unknown = ctl(self.target, "health", "--service", "no.such.Service")
        self.assertEqual(unknown.returncode, 4)
        self.assertEqual(unknown.stdout, "SERVICE_UNKNOWN\n")

    def test_daemon_error_exits_1_with_one_line(self):
        done = ctl(self.target, "lookup", "--pool", "nope", stdin="1 2 3")
        self.assertEqual(done.returncode, 1)
        self.assertRegex(done.stderr, r"^kvcachectl: lookup: NOT_FOUND: .+\n$")
        self.assertEqual(done.stdout, "")

    def test_usage_errors_exit_2(self):
        for args, stdin in [(["bogus"], None),
                            ([], None),
                            (["--bogus_flag", "pools"], None),
                            (["events", "--from", "abc"], None),
                            (["--timeout", "soon", "pools"], None),
                            (["pools", "--follow"], None),  # another command's flag
                            (["pools", "extra"], None),
                            (["lookup", "--pool", "default"], "1 2 x"),
                            (["lookup", "--pool", "default", "--tokens_file",
                              os.path.join(self.directory.name, "missing")], None),
                            (["lookup"], "1 2 3"),
                            (["describe"], None),  # --pool is required
                            (["health", "--watch"], None),  # not a read command that repeats
                            (["pools", "--count", "2"], None),  # --count without --watch
                            (["-o", "xml", "pools"], None),
                            (["--json", "-o", "yaml", "pools"], None),
                            (["help", "bogus"], None),
                            (["help", "stats", "pools"], None)]:
            done = ctl(self.target, *args, stdin=stdin)
            self.assertEqual(done.returncode, 2, "%s: %s" % (args, done.stderr))
            self.assertTrue(done.stderr.startswith("kvcachectl: "), done.stderr)

    def test_help_for_one_command(self):
        """`COMMAND --help` and `help COMMAND` print that command's usage and its own flags
        only; `help` alone, like --help, the whole text (exit 0, no daemon needed)."""
        whole = ctl(self.target, "--help")
        self.assertEqual(whole.returncode, 0, whole.stderr)
        self.assertIn("--tls_ca", whole.stdout)
        self.assertEqual(ctl(self.target, "help").stdout, whole.stdout)
        for args in (["stats", "--help"], ["help", "stats"], ["-o", "json", "stats", "--help"]):
            done = ctl(self.target, *args)
            self.assertEqual(done.returncode, 0, f"{args}: {done.stderr}")
            self.assertTrue(done.stdout.startswith("usage: kvcachectl [global flags] stats "),
                            done.stdout)
            flags = set(re.findall(r"^  --(\w+)$", done.stdout, re.M))
            self.assertEqual(flags, {"pool", "tenant", "watch", "count"}, done.stdout)
        events = ctl(self.target, "help", "events").stdout
        self.assertIn("  --follow\n", events)
        self.assertNotIn("  --tls_ca\n", events)

    def complete(self, line):
        """What bash completes for `line` (the cursor at its end) with `kvcachectl completion
        bash` sourced, as bash calls the function: COMP_WORDS split at COMP_WORDBREAKS."""
        script = r"""
source <("$KVCTL" completion bash) || exit 9
COMP_LINE=$LINE
COMP_POINT=${#COMP_LINE}
COMP_WORDS=() word=""
for (( k = 0; k < ${#LINE}; k++ )); do
  c=${LINE:k:1}
  if [[ $c == " " ]]; then [[ -n $word ]] && COMP_WORDS+=("$word"); word=""
  elif [[ $COMP_WORDBREAKS == *"$c"* ]]; then
    [[ -n $word ]] && COMP_WORDS+=("$word"); COMP_WORDS+=("$c"); word=""
  else word+=$c; fi
done
COMP_WORDS+=("$word")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_kvcachectl
printf '%s\n' "${COMPREPLY[@]}"
"""
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=COMMAND_BOUND,
                              env=dict(os.environ, KVCTL=binary("kvcachectl"),
                                       LINE=binary("kvcachectl") + " " + line))
        self.assertEqual(done.returncode, 0, done.stderr)
        return sorted(done.stdout.split())

    def test_bash_completion(self):
        """`kvcachectl completion bash`: commands, flags (the command's and the global ones),
        -o's values, files, and --pool's values from the daemon the line names; a --target
        value with ':' and '=' in it, which bash splits into several words, is read whole."""
        self.assertEqual(self.complete("st"), ["stats"])
        self.assertEqual(self.complete("help de"), ["describe"])
        self.assertEqual(self.complete("-o j"), ["json"])
        self.assertEqual(self.complete("completion "), ["bash"])
        self.assertEqual(self.complete(f"--target {self.target} se"), ["sessions"])
        self.assertEqual(self.complete(f"--target={self.target} -o yaml po"), ["pools"])
        self.assertEqual(self.complete("stats --c"), ["--count"])
        self.assertIn("--tenant", self.complete("stats --t"))
        self.assertIn("--tls_ca", self.complete("stats --t"))
        self.assertNotIn("--follow", self.complete("stats --"))
        self.assertIn("--follow", self.complete("events --"))
        self.assertEqual(self.complete(f"--target {self.target} describe --pool "),
                         ["default", "tiered"])
        self.assertEqual(self.complete(f"--target={self.target} stats --pool ti"), ["tiered"])
        self.assertEqual(self.complete("lookup --tokens_file " + self.directory.name + "/dae"),
                         [self.directory.name + "/daemon.log"])
        done = ctl(self.target, "completion", "zsh")
        self.assertEqual(done.returncode, 2, done.stderr)

    def test_no_daemon_exits_3_at_once_with_the_reason(self):
        """The three commonest mistakes (no socket, a stale one, another uid's) and a closed TCP
        port each fail in well under the 5 s --timeout, naming the cause."""
        missing = "unix://" + os.path.join(self.directory.name, "nobody.sock")
        stale_path = os.path.join(self.directory.name, "stale.sock")
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(stale_path)  # bound, never listening: what a killed daemon leaves behind
        not_socket = os.path.join(self.directory.name, "not-a-socket")
        with open(not_socket, "w") as file:
            file.write("x")
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        closed_port = "127.0.0.1:%d" % tcp.getsockname()[1]
        tcp.close()
        cases = [(missing, "NOT_FOUND: no such socket: " + missing[len("unix://"):]),
                 ("unix://" + stale_path, "UNAVAILABLE: connection refused: " + stale_path),
                 ("unix://" + not_socket, "FAILED_PRECONDITION: not a socket"),
                 (closed_port, "UNAVAILABLE: cannot connect to the kvcache daemon at " +
                  closed_port)]
        try:
            for target, reason in cases:
                for command in ["pools", "stats", "health", "events"]:
                    started = time.monotonic()
                    done = ctl(target, command)
                    elapsed = time.monotonic() - started
                    self.assertEqual(done.returncode, 3, "%s: %s" % (command, done.stderr))
                    self.assertIn(reason, done.stderr)
                    self.assertLess(elapsed, 2.5, "%s %s took %.1fs" % (target, command, elapsed))
        finally:
            stale.close()

    def test_permission_denied_exits_3_at_once(self):
        """A socket the caller may not open: as root, kvcachectl runs as nobody."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run kvcachectl as another uid")
        private = tempfile.mkdtemp(prefix="private.", dir=self.directory.name)
        os.chmod(private, 0o700)
        path = os.path.join(private, "kv.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        try:
            def as_nobody():
                os.setgid(65534)
                os.setuid(65534)
            started = time.monotonic()
            done = subprocess.run([binary("kvcachectl"), "--target", "unix://" + path, "pools"],
                                  capture_output=True, text=True, timeout=COMMAND_BOUND,
                                  preexec_fn=as_nobody)
            if "Permission denied" in done.stderr and "exec" in done.stderr:
                self.skipTest("nobody cannot run the build's binaries")
            self.assertEqual(done.returncode, 3, done.stderr)
            self.assertIn("PERMISSION_DENIED: permission denied: " + path, done.stderr)
            self.assertLess(time.monotonic() - started, 2.5)
        finally:
            listener.close()

    def test_version(self):
        """No daemon needed: the client's version, as text, JSON and YAML."""
        nowhere = "unix://" + os.path.join(self.directory.name, "nobody.sock")
        version_re = r"^kvcachectl \d+\.\d+\.\d+( \(\S+\))?\n$"
        self.assertRegex(ctl(nowhere, "version").stdout, version_re)
        flag = ctl(nowhere, "--version")
        self.assertEqual(flag.returncode, 0, flag.stderr)
        self.assertRegex(flag.stdout, version_re)
        document = json.loads(ctl(nowhere, "-o", "json", "version").stdout)
        self.assertEqual(list(document), ["client"])
        self.assertRegex(document["client"]["version"], r"^\d+\.\d+\.\d+$")
        if yaml is not None:
            self.assertEqual(yaml.safe_load(ctl(nowhere, "-o", "yaml", "version").stdout),
                             document)

    def test_version_names_the_daemon(self):
        """With a daemon at the target, its version and revision too, as it reports them."""
        text = self.run_ok("version").stdout
        lines = text.splitlines()
        self.assertEqual(len(lines), 2, text)
        self.assertRegex(lines[0], r"^kvcachectl \d+\.\d+\.\d+( \(\S+\))?$")
        self.assertRegex(lines[1], r"^kvcache-manager \d+\.\d+\.\d+( \(\S+\))? at \S+$")
        document = json.loads(self.run_ok("-o", "json", "version").stdout)
        self.assertEqual(sorted(document), ["client", "server"])
        # One build made both binaries: the daemon reports the version kvcachectl was built as.
        self.assertEqual(document["server"]["version"], document["client"]["version"])
        self.assertEqual(document["server"]["revision"], document["client"]["revision"])

    def test_yaml_is_the_json_document(self):
        if yaml is None:
            self.skipTest("no PyYAML")
        for args in [["pools"], ["stats"], ["stats", "--pool", "tiered"], ["health"],
                     ["lookup", "--pool", "default"]]:
            stdin = " ".join(map(str, tokens(PROMPT_A_FIRST, PROMPT_A_TOKENS)))
            as_json = json.loads(self.run_ok("-o", "json", *args, stdin=stdin).stdout)
            as_yaml = self.run_ok("-o=yaml", *args, stdin=stdin).stdout
            sys.stderr.write("\n$ kvcachectl -o yaml %s\n%s" % (" ".join(args), as_yaml))
            self.assertEqual(yaml.safe_load(as_yaml), as_json, args)
        events = self.run_ok("-o", "yaml", "events", "--limit", "2").stdout
        self.assertEqual(list(yaml.safe_load_all(events)),
                         json_lines(self.run_ok("--json", "events", "--limit", "2").stdout))

    def test_no_headers(self):
        # A session's lease runs down between the two calls: its remaining time is left out.
        def steady(row):
            return [cell for cell in row if not re.fullmatch(r"[0-9.]+(ms|s|m|h)", cell)]

        for command in ["pools", "sessions"]:
            with_headers = self.table(command)
            self.assertEqual(steady(self.table("--no-headers", command)[0]),
                             steady(with_headers[1]))
        stats = self.table("--no-headers", "stats")
        self.assertEqual(stats[0][0], "default")
        self.assertNotIn("sessions:", [row[0] for row in stats if row] + sum(stats, []))
        events = self.table("--no-headers", "events", "--limit", "1")
        self.assertEqual(events[0][:3], ["0", events[0][1], "AllBlocksCleared"])

    def test_watch_runs_again_every_interval(self):
        started = time.monotonic()
        out = self.run_ok("stats", "--watch", "0.3", "--count", "3").stdout
        self.assertGreaterEqual(time.monotonic() - started, 0.6)
        self.assertEqual(out.count("POOL "), 3, out)
        self.assertEqual(out.count("\n\nPOOL "), 2, out)  # a blank line between runs

        decoder = json.JSONDecoder()
        text = self.run_ok("-o", "json", "pools", "--watch=0.1", "--count", "2").stdout
        first, end = decoder.raw_decode(text)
        second, _ = decoder.raw_decode(text[end:].lstrip())
        self.assertEqual([p["name"] for p in second["pools"]], [p["name"] for p in first["pools"]])
        if yaml is not None:
            documents = list(yaml.safe_load_all(self.run_ok(
                "-o", "yaml", "sessions", "--watch", "0.1", "--count", "2").stdout))
            self.assertEqual(len(documents), 2)

        # Until ^C, which ends it at once with exit 0.
        process = subprocess.Popen([binary("kvcachectl"), "--target", self.target, "pools",
                                    "--watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            self.assertTrue(process.stdout.readline().startswith("NAME"))
            process.send_signal(signal.SIGINT)
            self.assertEqual(process.wait(timeout=COMMAND_BOUND), 0)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdout.close()
            process.stderr.close()


class KvcachectlRestartTest(unittest.TestCase):
    """Daemons that stop: events --follow across a restart (it resumes by itself, and the new
    daemon's snapshot, its epoch differing, brings it up to date); health while draining."""

    def test_health_reports_not_serving_while_draining(self):
        with tempfile.TemporaryDirectory(prefix="kvcachectl_drain.") as directory:
            daemon = Daemon(directory)
            try:
                if daemon.health_target is None:
                    self.skipTest("kvcache-manager has no --health_listen")
                serving = ctl(daemon.health_target, "health")
                self.assertEqual((serving.returncode, serving.stdout), (0, "SERVING\n"),
                                 serving.stderr)
                # SIGTERM: health says NOT_SERVING (exit 4) for the drain period, then the port
                # goes away.
                daemon.terminate()
                deadline = time.monotonic() + COMMAND_BOUND
                while True:
                    done = ctl(daemon.health_target, "--timeout", "1s", "health")
                    if done.returncode != 0 or time.monotonic() > deadline:
                        break
                self.assertEqual((done.returncode, done.stdout), (4, "NOT_SERVING\n"),
                                 done.stderr)
            finally:
                daemon.stop()

    def test_a_snapshot_ends_at_the_new_epochs_resume_point(self):
        # A watcher from another epoch whose resume sequence the daemon has counted to exactly
        # (2: AllBlocksCleared, one commit) gets a snapshot whose last message also says 2. Only
        # the snapshot_end marker tells it from the snapshot's other messages, which repeat the
        # old epoch's 2: without it the resume point kept the old epoch.
        with tempfile.TemporaryDirectory(prefix="kvcachectl_snapshot.") as directory:
            daemon = Daemon(directory)
            try:
                client(daemon.target, "compute-and-commit", 100, 2 * BLOCK_SIZE)
                done = ctl(daemon.target, "--json", "events")
                self.assertEqual(done.returncode, 0, done.stderr)
                next_sequence, epoch = resume_point(done.stderr)
                self.assertEqual(next_sequence, 2)
                old_epoch = epoch ^ 1
                done = ctl(daemon.target, "--json", "events", "--from", "2", "--epoch",
                           str(old_epoch))
                self.assertEqual(done.returncode, 0, done.stderr)
                events = json_lines(done.stdout)
                self.assertEqual([e["kind"] for e in events],
                                 ["AllBlocksCleared", "BlocksStored", "BlocksStored"])
                self.assertEqual(resume_point(done.stderr), (2, epoch))
            finally:
                daemon.stop()

    def test_follow_resumes_after_a_restart(self):
        with tempfile.TemporaryDirectory(prefix="kvcachectl_restart.") as directory:
            daemon = Daemon(directory)
            try:
                client(daemon.target, "compute-and-commit", 100, 2 * BLOCK_SIZE)
                watcher = Watcher(daemon.target)
                try:
                    before = [watcher.next_event() for _ in range(2)]
                    self.assertEqual([e["kind"] for e in before],
                                     ["AllBlocksCleared", "BlocksStored"])
                    daemon.stop()
                    daemon = Daemon(directory)
                    # Two commits: the new daemon's sequence passes the old one's (2), so the
                    # final resume point is unambiguously in the new epoch.
                    client(daemon.target, "compute-and-commit", 200, 3 * BLOCK_SIZE)
                    client(daemon.target, "compute-and-commit", 300, 2 * BLOCK_SIZE)
                    # The new daemon's snapshot (AllBlocksCleared, then what it holds, one event
                    # per block), then live events: 5 blocks in all, whenever kvcachectl came back.
                    after = []
                    while sum(e["num_blocks"] or 0 for e in after) < 5:
                        after.append(watcher.next_event())
                    self.assertEqual(after[0]["kind"], "AllBlocksCleared")
                    self.assertTrue(all(e["kind"] == "BlocksStored" for e in after[1:]), after)
                    code, stderr = watcher.interrupt()
                finally:
                    watcher.close()
                self.assertEqual(code, 0, stderr)
                self.assertIn("stream broke", stderr)
                old_epoch = int(re.search(r"resuming with --from \d+ --epoch (\d+)",
                                          stderr).group(1))
                _, new_epoch = resume_point(stderr)
                self.assertNotEqual(new_epoch, old_epoch)
            finally:
                daemon.stop()


if __name__ == "__main__":
    if not BIN_DIR:
        sys.exit("KVCACHE_BIN_DIR is not set")
    unittest.main(verbosity=2)
