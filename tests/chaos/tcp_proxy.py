"""A loopback TCP fault proxy: the chaos suite's stand-in for a dependency going away.

The system under test is pointed at the proxy (127.0.0.1:<proxy.port>) instead of the real
PostgreSQL, RabbitMQ or Redis, and the test process injects faults without touching the real
service that CI and other developers share:

- `cut()`: every open connection is reset (RST, as when a server dies) and new ones are reset
  at once, until `restore()` — a service that is down or restarting.
- `refuse_new(reply=None)`: connections already open keep working; a new one is accepted, sent
  `reply` (bytes, or a callable given the client socket) and closed — a server out of
  connection slots. `postgres_too_many_clients` is PostgreSQL's own answer then ("FATAL:
  sorry, too many clients already", SQLSTATE 53300).
- `restore()`: new connections are forwarded again.

Threads only (one accept loop, two pumps per connection). It listens on 127.0.0.1 unless given
another local address (`bind_host`: the multi-host suite's veth addresses).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable

Reply = bytes | Callable[[socket.socket], None] | None

PASS, CUT, REFUSE = "pass", "cut", "refuse"


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a dead peer's kernel does; never raises."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream, pumped both ways by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self._closed = threading.Event()

    def start(self) -> None:
        for src, dst in ((self.client, self.upstream), (self.upstream, self.client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close(reset=False)

    def close(self, *, reset: bool) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for sock in (self.client, self.upstream):
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
        self.proxy._forget(self)


class FaultProxy:
    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        bind_host: str = "127.0.0.1",
        name: str = "",
    ):
        self.name = name or f"proxy->{target_port}"
        self.target = (target_host, target_port)
        self.bind_host = bind_host
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, 0))
        self._listener.listen(512)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._mode = PASS
        self._reply: Reply = None
        self._stopped = threading.Event()
        # What happened, for the scenario's report.
        self.accepted = 0
        self.forwarded = 0
        self.refused = 0
        self.cut_at: float | None = None
        self.restored_at: float | None = None
        self._thread = threading.Thread(target=self._accept_loop, name=self.name, daemon=True)
        self._thread.start()

    # --- controls ------------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every open connection and every new one until restore()."""
        with self._lock:
            self._mode = CUT
            links = list(self._links)
        self.cut_at = time.monotonic()
        for link in links:
            link.close(reset=True)

    def cut_existing(self) -> int:
        """Reset the connections open now, leaving the mode (and new connections) alone."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close(reset=True)
        return len(links)

    def refuse_new(self, reply: Reply = None) -> None:
        """Keep open connections; answer each new one with `reply` and close it."""
        with self._lock:
            self._mode = REFUSE
            self._reply = reply
        self.cut_at = time.monotonic()

    def restore(self) -> None:
        with self._lock:
            self._mode = PASS
            self._reply = None
        self.restored_at = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close(reset=True)

    # --- state -----------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    def url(self, scheme_and_auth: str, path: str = "") -> str:
        """e.g. url("amqp://guest:guest@", "//") → amqp://guest:guest@127.0.0.1:<port>//"""
        return f"{scheme_and_auth}{self.bind_host}:{self.port}{path}"

    # --- internals -------------------------------------------------------------------------

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.01)  # a transient failure must not end the proxy for good
                continue
            self.accepted += 1
            try:
                self._serve(client)
            except Exception:  # noqa: BLE001 - one connection's failure never ends the loop
                _reset(client)

    def _serve(self, client: socket.socket) -> None:
        """Forward, refuse or reset one accepted connection, as the mode says."""
        with contextlib.suppress(OSError):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            mode, reply = self._mode, self._reply
        if mode == CUT:
            self.refused += 1
            _reset(client)
            return
        if mode == REFUSE:
            self.refused += 1
            threading.Thread(target=self._refuse, args=(client, reply), daemon=True).start()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            _reset(client)
            return
        link = _Link(self, client, upstream)
        with self._lock:
            passing = self._mode == PASS
            if passing:
                self._links.add(link)
        if not passing:  # cut while connecting: this one goes too
            # Outside the lock: closing a link takes it (_forget), and it is not reentrant.
            link.close(reset=True)
            return
        self.forwarded += 1
        link.start()

    @staticmethod
    def _refuse(client: socket.socket, reply: Reply) -> None:
        try:
            client.settimeout(5)
            if callable(reply):
                reply(client)
            elif reply:
                client.sendall(reply)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                client.close()


# --- PostgreSQL's "too many clients" -----------------------------------------------------

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


def _pg_error(severity: str, code: str, message: str) -> bytes:
    fields = b"".join(
        tag + value.encode() + b"\0"
        for tag, value in ((b"S", severity), (b"V", severity), (b"C", code), (b"M", message))
    )
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def postgres_too_many_clients(client: socket.socket) -> None:
    """What a PostgreSQL server with no free slot answers a new connection: it reads the
    startup packet (declining SSL/GSS encryption first) and sends FATAL 53300."""
    while True:
        length = struct.unpack("!I", _read_exact(client, 4))[0]
        packet = _read_exact(client, length - 4)
        code = struct.unpack("!I", packet[:4])[0] if len(packet) >= 4 else 0
        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
            client.sendall(b"N")
            continue
        break
    client.sendall(_pg_error("FATAL", "53300", "sorry, too many clients already"))
