"""A real Redis Cluster on this machine: 3 masters and 3 replicas, `redis-server`
processes on free local ports in a temporary folder, joined by `redis-cli --cluster
create`. For tests (the session fixture `redis_cluster`) and benchmarks:

    with LocalCluster(workdir) as cluster:
        store = RedisStore(cluster.url, cluster=True, shards=16)

Nodes time out after `NODE_TIMEOUT_MS` (short, so that a failover takes seconds).
The cluster has database 0 only: each test keeps to keys under its own prefix and
deletes them after (`delete_prefix`).
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest
import redis

from tests.support import eventually, unavailable

MASTERS = 3
REPLICAS_PER_MASTER = 1
NODE_TIMEOUT_MS = 2000
BUS_PORT_OFFSET = 10_000  # Redis's cluster bus listens on port + 10000
PORT_RANGE = (20_000, 40_000)


def missing_tools() -> str | None:
    """Why a local cluster cannot start here, or None."""
    absent = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    return f"{' and '.join(absent)} not on PATH" if absent else None


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` ports whose cluster-bus port (port + 10000) is free as well."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(*PORT_RANGE)
        if port not in ports and _free(port) and _free(port + BUS_PORT_OFFSET):
            ports.append(port)
    return ports


class LocalCluster:
    """Six `redis-server --cluster-enabled yes` processes made into one cluster."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = free_ports(MASTERS * (1 + REPLICAS_PER_MASTER))
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """Any node's URL names the cluster; this is the first node's."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> Self:
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            eventually(lambda p=port: _answers(p), 10, f"redis-server on {port}")  # type: ignore[misc]
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        command = ["redis-cli", "--cluster", "create", *nodes]
        command += ["--cluster-replicas", str(REPLICAS_PER_MASTER), "--cluster-yes"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        self.wait_healthy()
        return self

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.kill()
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (close it after use)."""
        return redis.Redis(port=port, decode_responses=True, socket_timeout=10)

    def masters(self) -> list[int]:
        """The ports of the nodes serving slots now, in slot order."""
        with self.node(self._live_port()) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        return [int(r[2][1]) for r in sorted(ranges, key=lambda r: int(r[0]))]

    def replica_of(self, master: int) -> int:
        with self.node(master) as client:
            info = client.info("replication")
        return int(info["slave0"]["port"])

    def master_of_key(self, key: str) -> int:
        """The port of the master that serves `key`'s slot."""
        with self.node(self._live_port()) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            ranges = client.execute_command("CLUSTER", "SLOTS")
        return next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))

    def keys(self, pattern: str) -> dict[int, list[str]]:
        """The keys matching `pattern` on each master."""
        found: dict[int, list[str]] = {}
        for port in self.masters():
            with self.node(port) as client:
                found[port] = list(client.scan_iter(match=pattern, count=1000))
        return found

    def delete_prefix(self, prefix: str) -> None:
        for port, keys in self.keys(prefix + "*").items():
            with self.node(port) as client:
                for key in keys:  # one by one: keys on one node may lie in many slots
                    client.delete(key)

    def failover(self, master: int, timeout_s: float = 30) -> int:
        """Promote `master`'s replica (`CLUSTER FAILOVER`: the replica catches up, then
        takes over, so no acknowledged write is lost); returns the new master's port."""
        replica = self.replica_of(master)
        with self.node(replica) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        eventually(lambda: replica in self.masters(), timeout_s, f"{replica} to take over")
        self.wait_healthy(timeout_s)
        return replica

    def pause(self, port: int) -> None:
        """SIGSTOP the node until `resume` (what is sent to it meanwhile waits in its
        socket buffers, to be read when it resumes)."""
        self._procs[port].send_signal(signal.SIGSTOP)

    def cut_off_replica(self, master: int) -> int:
        """Pause `master`'s replica and drop its replication link: the master's later
        writes stay on the master alone; returns the replica's port."""
        replica = self.replica_of(master)
        self.pause(replica)
        with self.node(master) as client:
            client.client_kill_filter(_type="replica")
        return replica

    def resume(self, port: int) -> None:
        self._procs[port].send_signal(signal.SIGCONT)

    def crash(self, port: int) -> None:
        """SIGKILL the node: what it held in memory only is gone."""
        self._procs[port].kill()
        self._procs[port].wait()

    def restart(self, port: int) -> None:
        """Start a crashed node again, empty: it rejoins as a replica of its successor.
        A node still running is left as it is."""
        if self._procs[port].poll() is None:
            return
        self._start_node(port)
        eventually(lambda: _answers(port), 10, f"redis-server on {port}")

    def take_over(self, replica: int, timeout_s: float = 30) -> None:
        """`CLUSTER FAILOVER TAKEOVER`: the replica becomes master at once, without its
        master's consent or catching up (its master is gone)."""
        with self.node(replica) as client:
            client.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        eventually(lambda: replica in self.masters(), timeout_s, f"{replica} to take over")

    def wait_healthy(self, timeout_s: float = 30) -> None:
        """Until every node says `cluster_state:ok` and knows every other, and every
        master has a replica in sync."""
        eventually(self._healthy, timeout_s, "the Redis Cluster to be healthy", every_s=0.1)

    def _healthy(self) -> bool:
        try:
            for port in self._procs:
                with self.node(port) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    replication = client.info("replication")
                text = info if isinstance(info, str) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                if f"cluster_known_nodes:{len(self.ports)}" not in text:
                    return False
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
            masters = self.masters()
        except (redis.RedisError, OSError, KeyError):
            return False
        return len(masters) == MASTERS

    def _start_node(self, port: int) -> None:
        folder = self.workdir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
        command += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        command += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
        command += ["--appendonly", "no", "--save", "", "--dir", str(folder)]
        command += ["--daemonize", "no", "--logfile", "redis.log"]
        command += ["--enable-debug-command", "local"]  # DEBUG SLEEP, to stall a node
        self._procs[port] = subprocess.Popen(command, stdout=subprocess.DEVNULL)

    def _live_port(self) -> int:
        return next(port for port in self.ports if _answers(port))


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-master, 3-replica Redis Cluster for the whole session; the tests that fail a
    master over leave it healthy (3 masters, each with a replica in sync)."""
    missing = missing_tools()
    if missing is not None:
        unavailable(f"a local Redis Cluster cannot start: {missing}")
    with LocalCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster_prefix(redis_cluster: LocalCluster) -> Iterator[str]:
    """A key prefix of the test's own (the cluster has one database, shared by the
    session); its keys are deleted after."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    redis_cluster.delete_prefix(prefix)
