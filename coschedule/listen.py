"""The listening sockets of both processes, made before uvicorn starts.

``--host ::`` (serve's default; the reconciler's health port always) listens on IPv6 and IPv4
at once: one IPv6 socket with ``IPV6_V6ONLY`` off, so a pod reached on an IPv6-only, an
IPv4-only or a dual-stack cluster answers on every address it has. asyncio's own
``create_server`` sets ``IPV6_V6ONLY`` on, which is why the socket is ours. A kernel without
IPv6 (booted with ``ipv6.disable=1``) gets ``0.0.0.0`` instead. Any other host is bound as
given (``127.0.0.1``, ``::1``, a name).
"""

from __future__ import annotations

import errno
import socket

EVERY_ADDRESS = "::"
BACKLOG = 2048  # uvicorn's default


class ListenError(OSError):
    """A port that cannot be listened on; the message names host, port and why."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for ``host``:``port``; ListenError when there is none."""
    try:
        if host == EVERY_ADDRESS:
            try:
                return _bound(socket.AF_INET6, ("::", port), dual_stack=True)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise
                return _bound(socket.AF_INET, ("0.0.0.0", port))  # no IPv6 in this kernel
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return _bound(family, address)
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host
        why = (exc.strerror or str(exc)).lower()
        if exc.errno == errno.EADDRINUSE:
            why += ": another process listens there; stop it or give another port"
        raise ListenError(f"cannot listen on {shown}:{port}: {why}") from None


def _bound(family: int, address: tuple[object, ...], *, dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted process binds at once, while the old connections are in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def describe(sock: socket.socket) -> str:
    """Where a socket listens, for the log: ``[::]:8443 (IPv6 and IPv4)``."""
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6:
        dual = not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
        return f"[{host}]:{port}" + (" (IPv6 and IPv4)" if dual else "")
    return f"{host}:{port}"
