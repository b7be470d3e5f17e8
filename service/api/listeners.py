"""The server's listening sockets, bound before the model loads and listening only once it is loaded,
so that a port in use is said in seconds, not after the load (`service.api.main` hands them to uvicorn)."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence

from service.api.start_checks import InvalidSettingsError


def _where(host: str) -> str:
    """HTMLLM_HOST as an error names it: the empty string binds every address of both families."""
    return host if host else "every IPv4 and IPv6 address (HTMLLM_HOST '')"


def _bind_refused(host: str, port: int, exc: OSError) -> InvalidSettingsError:
    """The one line for a port this server cannot have: the settings, not the model, are at fault."""
    if exc.errno == errno.EADDRINUSE:
        return InvalidSettingsError(
            f"port {port} on {_where(host)} is in use (address already in use): another server listens "
            "there; stop it or choose another HTMLLM_PORT / --port"
        )
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EACCES and 0 < port < 1024:
        reason += ": a port below 1024 needs root or CAP_NET_BIND_SERVICE"
    return InvalidSettingsError(
        f"cannot bind port {port} on {_where(host)} ({reason}); check HTMLLM_HOST / "
        "--host and HTMLLM_PORT / --port"
    )


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """The sockets uvicorn would bind for `host`:`port`, bound now, before the model loads, for
    `uvicorn.Server.run(sockets=...)`; InvalidSettingsError, with the cause, when one cannot be bound.

    uvicorn bound only after the load and the lifespan's start: a port in use was found after all of it
    (its error log, its status 3). A probe that bound and closed again would leave the port to whoever
    binds it during the load. As asyncio's `create_server(host=, port=)`: every address `host` resolves
    to ('': both families), SO_REUSEADDR (TIME_WAIT is free), IPv6 sockets IPv6-only, a family this kernel
    lacks skipped. Not listening yet (`listen`): a client during the load is refused, as before."""
    hosts: list[str | None] = [None] if host == "" else [host]
    try:
        found = {
            info
            for each in hosts
            for info in socket.getaddrinfo(
                each, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
            )
        }
    except OSError as exc:  # socket.gaierror: a host name that resolves to nothing
        raise _bind_refused(host, port, exc) from exc
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in sorted(found, key=lambda info: (info[0], str(info[4]))):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # as asyncio: a family (IPv6) this kernel has no sockets for is no error
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in bound:
            sock.close()
        raise _bind_refused(host, port, exc) from exc
    if not bound:
        raise InvalidSettingsError(
            f"cannot bind port {port} on {_where(host)}: no socket of its families here"
        )
    return bound


def listen(listeners: Sequence[socket.socket], backlog: int, host: str, port: int) -> None:
    """Make `listeners` (`bind_listeners`') listen, once the model is loaded; InvalidSettingsError when
    another server took the port meanwhile. Linux lets two sockets with SO_REUSEADDR bind one port while
    neither listens: two servers started together both bind it, and the first to listen has it. Here the
    second is told in one line, before uvicorn (whose `create_server(sock=)` would raise a traceback)."""
    try:
        for sock in listeners:
            sock.listen(backlog)
    except OSError as exc:
        raise _bind_refused(host, port, exc) from exc


def log_listening(listeners: Sequence[socket.socket]) -> None:
    """uvicorn's 'Uvicorn running on' line, which it writes only for sockets it bound itself; each
    socket's own address, so `--port 0` says the port it got."""

    def url(sock: socket.socket) -> str:
        address, port = sock.getsockname()[:2]
        return f"http://[{address}]:{port}" if sock.family == socket.AF_INET6 else f"http://{address}:{port}"

    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on %s (Press CTRL+C to quit)", " and ".join(url(sock) for sock in listeners)
    )
