"""A TCP proxy on loopback in front of the Hub mirror that makes a long pull's faults happen on demand.

The bytes from the server to the client can be passed as they are, throttled (``slow``), held
back forever once a connection has carried ``after_bytes`` (``stall``: the socket stays open and
silent, as a hung transfer does), or cut there (``drop``: both sides closed, as a lost
connection). ``faults`` connections get the fault; the ones after them pass. The tests point a
host's ``hf_endpoint`` at ``proxy.url``.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

CHUNK = 4096


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self.after_bytes = 0
        self.rate = 0.0  # bytes per second in slow mode
        self.faults = 0  # connections still to get the fault
        self.faulted = 0  # connections that got it
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: str, after_bytes: int = 0, faults: int = 0, rate: float = 0.0) -> None:
        if mode not in ("pass", "slow", "stall", "drop"):
            raise ValueError(f"unknown mode {mode!r}")
        with self._lock:
            self.mode, self.after_bytes, self.faults, self.rate, self.faulted = mode, after_bytes, faults, rate, 0

    @contextmanager
    def faulty(self, mode: str, after_bytes: int = 0, faults: int = 0, rate: float = 0.0):
        """``set`` for the length of a with block, then ``heal``."""
        self.set(mode, after_bytes, faults, rate)
        try:
            yield self
        finally:
            self.heal()

    def heal(self) -> None:
        """Pass every byte from now on; ``faulted`` keeps its count."""
        with self._lock:
            self.mode, self.faults = "pass", 0

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        self._closing.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            done = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, done), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, done), daemon=True).start()

    def _take_fault(self) -> str:
        """The mode this connection runs in: a fault while some are left, else pass (slow always applies)."""
        with self._lock:
            if self.mode in ("stall", "drop"):
                if self.faults > 0:
                    self.faults -= 1
                    self.faulted += 1
                    return self.mode
                return "pass"
            return self.mode

    def _upstream(self, client: socket.socket, server: socket.socket, done: threading.Event) -> None:
        try:
            while data := client.recv(CHUNK):
                server.sendall(data)
        except OSError:
            pass
        done.set()
        _close(server)
        _close(client)

    def _downstream(self, server: socket.socket, client: socket.socket, done: threading.Event) -> None:
        sent, mode = 0, None
        try:
            while data := server.recv(CHUNK):
                if mode is None and self.mode in ("stall", "drop") and sent + len(data) > self.after_bytes:
                    mode = self._take_fault()
                    if mode in ("stall", "drop"):
                        client.sendall(data[: max(0, self.after_bytes - sent)])
                        if mode == "stall":  # hold the connection open and silent until the client gives up
                            while not done.is_set() and not self._closing.is_set():
                                time.sleep(0.1)
                        break
                client.sendall(data)
                sent += len(data)
                if self.mode == "slow" and self.rate > 0:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        _close(client)
        _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
