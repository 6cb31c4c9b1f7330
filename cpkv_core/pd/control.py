"""The control channel of a PD server: typed frames (``wire``) on an authenticated listener
bound to one address, one thread per connection, a reply to every request, until a
``Shutdown`` arrives. :class:`ControlServer` answers; a subclass says how (``_dispatch``)."""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection, Listener

from cpkv_core.pd.protocol import ErrorReply, Shutdown
from cpkv_core.pd.wire import MAX_REQUEST_BYTES, Message, WireError, decode, encode


class ControlServer:
    """Answers the frames of every connection to a listener on ``host`` (never all
    interfaces), authenticated by ``authkey``."""

    def __init__(self, host: str, authkey: bytes) -> None:
        self.listener = Listener((host, 0), authkey=authkey)
        self.stopped = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        """The control listener's (host, port)."""
        host, port = self.listener.address
        return str(host), int(port)

    def serve_forever(self) -> None:
        """Accepts connections, one thread each, until a Shutdown arrives."""
        threading.Thread(target=self._accept_loop, daemon=True).start()
        self.stopped.wait()

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                conn = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        """Answers one connection's frames in order until it closes or sends Shutdown.

        A frame that does not decode gets an ``ErrorReply`` saying why and the connection
        stays usable; a frame over ``MAX_REQUEST_BYTES`` closes it (its body is never read).
        """
        with conn:
            while True:
                try:
                    frame = conn.recv_bytes(MAX_REQUEST_BYTES)
                except (EOFError, OSError):
                    return
                try:
                    message = decode(frame)
                except WireError as exc:
                    conn.send_bytes(encode(ErrorReply(f"bad frame: {exc}")))
                    continue
                if isinstance(message, Shutdown):
                    conn.send_bytes(encode(None))
                    self.stopped.set()
                    return
                try:
                    reply = encode(self._dispatch(message))
                except Exception as exc:
                    reply = encode(ErrorReply(f"{type(exc).__name__}: {exc}"))
                conn.send_bytes(reply)

    def _dispatch(self, message: Message | None) -> Message | None:
        """The reply to one request."""
        raise NotImplementedError(f"{type(self).__name__} answers no {type(message).__name__}")
