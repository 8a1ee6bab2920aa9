"""Real redis-server processes on loopback for the tests: a standalone server and a three-primary
cluster made by `redis-cli --cluster create`, on free ports in temporary directories."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.support.servers import free_port

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
OPENSSL = shutil.which("openssl")

needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None or REDIS_CLI is None,
    reason="redis-server and redis-cli are not installed (Debian package redis-server)",
)


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1: start, stop (kill), restart on the same port and directory."""

    directory: str
    config: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    tls_cert: str | None = None  # serve TLS only, with this self-signed certificate (key beside)

    @property
    def url(self) -> str:
        if self.tls_cert:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls_cert}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        ports = ["--port", str(self.port)]
        if self.tls_cert:
            key = os.path.join(os.path.dirname(self.tls_cert), "key.pem")
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls_cert]
            ports += ["--tls-key-file", key, "--tls-ca-cert-file", self.tls_cert]
            ports += ["--tls-auth-clients", "no"]
        args = [
            REDIS_SERVER,
            *ports,
            "--bind",
            "127.0.0.1",
            "--dir",
            self.directory,
        ]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no", *self.config]
        with open(os.path.join(self.directory, "redis.log"), "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while self.cli("PING", check=False) != "PONG":
            if self.process.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.directory, "redis.log")) as tail:
                    raise RuntimeError(
                        f"redis-server on {self.port} did not start: {tail.read()[-2000:]}"
                    )
            time.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def cli(self, *command: str, check: bool = True) -> str:
        args = [REDIS_CLI, "-p", str(self.port), "--no-auth-warning"]
        if self.tls_cert:
            args += ["--tls", "--cacert", self.tls_cert]
        password = dict(zip(self.config[::2], self.config[1::2])).get("--requirepass")
        if password:
            args += ["-a", password]
        result = subprocess.run(
            [*args, *command], check=False, capture_output=True, text=True, timeout=10
        )
        if check and result.returncode:
            raise RuntimeError(result.stderr)
        return result.stdout.strip()


@contextlib.contextmanager
def redis_server(directory: str, *config: str) -> Iterator[RedisServer]:
    """A started standalone server (allkeys-lru unless `config` says otherwise), killed at exit."""
    server = RedisServer(
        directory, ("--maxmemory-policy", "allkeys-lru", "--maxmemory", "256mb", *config)
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


def cluster_port() -> int:
    """A free port a cluster node can take: its bus port, 10000 higher, must exist and be free."""
    while True:
        port = free_port()
        if port <= 55535:
            with contextlib.suppress(OSError), socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
                return port


@contextlib.contextmanager
def redis_tls_server(directory: str) -> Iterator[RedisServer]:
    """A started server speaking TLS only, its certificate self-signed for 127.0.0.1 by openssl."""
    cert = os.path.join(directory, "cert.pem")
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", os.path.join(directory, "key.pem"), "-out", cert]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = RedisServer(directory, ("--maxmemory-policy", "allkeys-lru"), tls_cert=cert)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@contextlib.contextmanager
def redis_cluster(directory: str, primaries: int = 3) -> Iterator[list[RedisServer]]:
    """A cluster of `primaries` primaries, no replicas, slots spread by `redis-cli --cluster create`."""
    nodes = []
    try:
        for index in range(primaries):
            node_dir = os.path.join(directory, f"node{index}")
            os.makedirs(node_dir)
            node = RedisServer(
                node_dir,
                (
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--maxmemory-policy",
                    "allkeys-lru",
                    "--maxmemory",
                    "128mb",
                ),
                port=cluster_port(),
            )
            node.start()
            nodes.append(node)
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while any("cluster_state:ok" not in node.cli("CLUSTER", "INFO") for node in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        yield nodes
    finally:
        for node in nodes:
            node.kill()


@contextlib.contextmanager
def slow_link(port: int, piece_bytes: int, every_s: float) -> Iterator[int]:
    """A loopback proxy to the server on `port` that passes what the server sends `piece_bytes` at
    a time, a piece every `every_s` (what the client sends passes at once): a server that answers,
    but a trickle at a time. Yields the proxy's port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(source: socket.socket, target: socket.socket, piece: int, pause: float) -> None:
        with source, target:
            try:
                while data := source.recv(piece):
                    target.sendall(data)
                    time.sleep(pause)
            except OSError:
                pass  # either side closed: the other goes with it

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener is closed
            server = socket.create_connection(("127.0.0.1", port))
            for source, target, piece, pause in (
                (client, server, 1 << 16, 0.0),
                (server, client, piece_bytes, every_s),
            ):
                threading.Thread(
                    target=pump, args=(source, target, piece, pause), daemon=True
                ).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
