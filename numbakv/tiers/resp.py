"""RESP pipelines on a redis-py connection's socket: a chunk goes out from its host-pool row and
comes back into it, with no copy in between.

redis-py packs a command's arguments into one new bytes object, and reads a reply into its buffer,
hiredis's and then a new bytes object: for chunks of megabytes those copies, and the page faults of
allocating them, cost more than the socket. Here a `SET` is its RESP prefix packed with the
chunk's header, then the row as it lies, handed to the kernel by one `sendmsg` for about 4 MiB of
commands (TLS sockets take them one `sendall` each), and a `GET`'s value is read with `recv_into`
straight into the row. The connection itself (its pool, TLS, AUTH and ACL, the database, a
cluster's nodes) stays redis-py's: only commands and replies pass here, on a connection that has
nothing else under way.
"""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from redis.exceptions import AskError, ConnectionError, MovedError, ResponseError

from numbakv.tiers.backend import StoredValue

BUFFER_BYTES = 1 << 16
"""Bytes read ahead of the reply under way (one `recv_into`); a bulk value past what is already
there is read into its destination directly."""
IOV_MAX = 512
"""Buffers handed to one `sendmsg` (Linux takes 1024)."""
SEND_BYTES = 4 << 20
"""Bytes of commands written by one system call: about what the kernel's send buffer holds (4 MiB
by default on Linux), so the server has the last group to read while the next is packed."""
_REDIRECTS = {b"MOVED": MovedError, b"ASK": AskError}
_ONE_LINE = frozenset(b":+-_#")
"""The first bytes of the replies that are one line: an integer, a status, an error, RESP3's null
and boolean."""


def command(name: bytes, key: bytes) -> list[bytes]:
    """`name key` (EXISTS, GET, DEL) as one buffer, packed by one format: a lookup packs one a
    chunk while the engine waits."""
    return [b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(name), name, len(key), key)]


def set_command(key: bytes, header: bytes, payload: memoryview, ttl_ms: int | None) -> list:
    """`SET key header+payload [PX ttl_ms]` as buffers, the payload as it lies (no copy): three
    buffers a chunk, the header packed with the command's prefix."""
    options = () if ttl_ms is None else (b"PX", b"%d" % ttl_ms)
    head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s" % (
        3 + len(options),
        len(key),
        key,
        len(header) + payload.nbytes,
        header,
    )
    return [head, payload, b"\r\n" + (_bulk_strings(options) if options else b"")]


def _bulk_strings(arguments: Sequence[bytes]) -> bytes:
    return b"".join(b"$%d\r\n%s\r\n" % (len(argument), argument) for argument in arguments)


def send(
    sock: socket.socket,
    commands: Iterable[Sequence[bytes | memoryview]],
    step_s: float | None = None,
) -> None:
    """Write the commands' buffers, in order, about SEND_BYTES a system call. `commands` may be
    lazy: the next group is then packed (a store's checksums taken) while the server still reads
    the last one out of the socket's buffer. The server has `step_s` to take each group (None:
    no bound but the socket's own timeout, which bounds one system call)."""
    group: list[bytes | memoryview] = []
    size = 0
    for buffers in commands:
        for buffer in buffers:
            if type(buffer) is not bytes:  # a row: its bytes, whatever its items
                buffer = memoryview(buffer)
                if buffer.format != "B" or buffer.ndim != 1:
                    buffer = buffer.cast("B")
            group.append(buffer)
            size += len(buffer)
        if size >= SEND_BYTES:
            _send_all(sock, group, _deadline(step_s))
            group, size = [], 0
    if group:
        _send_all(sock, group, _deadline(step_s))


def _send_all(
    sock: socket.socket, views: list[bytes | memoryview], deadline: float = math.inf
) -> None:
    """Write every buffer (bytes, or a view of bytes), in order, by `deadline`
    (time.monotonic()'s): `sendmsg` where the socket takes it (a plain one), IOV_MAX buffers a
    call, resuming where the kernel stopped; `sendall` each on a TLS socket."""
    if not _plain(sock):
        for view in views:
            sock.sendall(view)
            _check(deadline, "take a group of commands")
        return
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first : first + IOV_MAX])
        _check(deadline, "take a group of commands")
        while sent and first < len(views):
            size = len(views[first])
            if sent < size:
                views[first] = views[first][sent:]
                break
            sent -= size
            first += 1


@contextlib.contextmanager
def whole_reads(sock: socket.socket) -> Iterator[int]:
    """The `recv` flags for reading whole values off `sock` meanwhile: MSG_WAITALL on a plain
    socket, put in blocking mode with its timeout kept by the kernel (SO_RCVTIMEO, SO_SNDTIMEO),
    so a value is one system call instead of one per segment that arrives; 0 on a TLS socket."""
    timeout = sock.gettimeout()
    if not _plain(sock) or not timeout:
        yield 0
        return
    seconds = struct.pack("ll", int(timeout), int(timeout % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, seconds)
    sock.settimeout(None)
    try:
        yield socket.MSG_WAITALL
    finally:
        sock.settimeout(timeout)


class Replies:
    """Reads one pipeline's replies, in order, off `sock` (`flags` for reading a value whole).
    The server has `step_s` to send each reply whole (None: no bound but the socket's own
    timeout, which bounds one system call, so a reply trickling in could hold the batch for
    ever); past it, TimeoutError."""

    def __init__(self, sock: socket.socket, flags: int = 0, step_s: float | None = None) -> None:
        self._sock = sock
        self._flags = flags
        self._step_s = step_s
        self._deadline = math.inf
        self._buffer = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0  # what was read and not yet taken
        self._parsed: deque[object] = deque()  # one-line replies taken ahead, in order

    def reply(self) -> object:
        """The next reply: bytes for a status or a bulk string, an int, None for a null, an
        exception instance for an error (redis-py's class for a cluster's redirect)."""
        if self._parsed:
            return self._parsed.popleft()
        self._deadline = _deadline(self._step_s)
        line = self._line()
        if line[:1] == b"$":
            length = int(line[1:])
            if length < 0:
                return None
            value = bytearray(length)
            self._read_into(memoryview(value))
            self._skip_crlf()
            return bytes(value)
        answer = _one_line_reply(line)
        self._parse_ahead()
        return answer

    def value_into(self, header_bytes: int, payload: memoryview) -> object:
        """The next reply, a bulk string read into place: its first `header_bytes` as the
        header, then at most `payload.nbytes` into `payload`, the rest dropped. A StoredValue
        (the header and how many bytes followed it), None for a null, or an error instance."""
        if self._parsed:  # a one-line reply (an error) where a value was asked for
            return self._parsed.popleft()
        self._deadline = _deadline(self._step_s)
        line = self._line()
        if line[:1] != b"$":
            self._unread(line)
            return self.reply()
        length = int(line[1:])
        if length < 0:
            return None
        header = bytearray(min(length, header_bytes))
        self._read_into(memoryview(header))
        body = length - len(header)
        self._read_into(payload[: min(body, payload.nbytes)])
        self._drop(body - min(body, payload.nbytes))
        self._skip_crlf()
        return StoredValue(bytes(header), body)

    def _parse_ahead(self) -> None:
        """Take every whole one-line reply read already, up to the first bulk one: the replies of
        a pipeline of EXISTS, DEL or SET are then split out of the buffer at once, not searched
        for, under a deadline, one `reply` at a time."""
        if self._start == self._end or self._buffer[self._start] not in _ONE_LINE:
            return
        lines = bytes(self._view[self._start : self._end]).split(b"\r\n")
        del lines[-1]  # what follows the last CRLF: part of a reply, or nothing
        for line in lines:
            if not line or line[0] not in _ONE_LINE:
                return
            self._parsed.append(_one_line_reply(line))
            self._start += len(line) + 2

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n", self._start, self._end)
            if end >= 0:
                line = bytes(self._view[self._start : end])
                self._start = end + 2
                return line
            self._fill()

    def _unread(self, line: bytes) -> None:
        self._start -= len(line) + 2

    def _fill(self) -> None:
        """Read more after what is buffered, first moving it to the front."""
        if self._start:
            kept = self._end - self._start
            self._view[:kept] = self._view[self._start : self._end]
            self._start, self._end = 0, kept
        if self._end == len(self._buffer):  # a line longer than the buffer: grow it
            self._view.release()
            self._buffer.extend(bytes(len(self._buffer)))
            self._view = memoryview(self._buffer)
        self._end += self._received(self._sock.recv_into(self._view[self._end :]))

    def _read_into(self, target: memoryview) -> None:
        """Fill `target`: first from what is buffered, the rest straight from the socket."""
        buffered = min(self._end - self._start, target.nbytes)
        target[:buffered] = self._view[self._start : self._start + buffered]
        self._start += buffered
        filled = buffered
        while filled < target.nbytes:
            filled += self._received(self._sock.recv_into(target[filled:], 0, self._flags))

    def _received(self, got: int) -> int:
        """`got`, the bytes one read brought, once checked: none means the server has closed
        the connection, and a reply past its deadline is a timeout."""
        if not got:
            raise ConnectionError("the server closed the connection")
        _check(self._deadline, "send one reply")
        return got

    def _drop(self, count: int) -> None:
        while count:
            if self._start == self._end:
                self._fill()
            taken = min(count, self._end - self._start)
            self._start += taken
            count -= taken

    def _skip_crlf(self) -> None:
        while self._end - self._start < 2:
            self._fill()
        if self._view[self._start : self._start + 2] != b"\r\n":
            raise ConnectionError("a bulk reply did not end where its length said")
        self._start += 2


def _one_line_reply(line: bytes) -> object:
    """The reply a line without a bulk value is (`line` without its CRLF)."""
    kind, body = line[:1], line[1:]
    if kind == b":":
        return int(body)
    if kind == b"+":
        return body
    if kind == b"-":
        return _error(body)
    if kind == b"_":
        return None
    if kind == b"#":
        return body == b"t"
    raise ConnectionError(f"unexpected reply from the server: {line[:40]!r}")


def _deadline(step_s: float | None) -> float:
    return math.inf if step_s is None else time.monotonic() + step_s


def _check(deadline: float, step: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"the server took too long to {step}")


def _error(body: bytes) -> ResponseError:
    code, _, rest = body.partition(b" ")
    redirect = _REDIRECTS.get(code)
    if redirect is not None:  # as redis-py makes them: the slot and the node, without the code
        return redirect(rest.decode(errors="replace"))
    return ResponseError(body.decode(errors="replace"))


def _plain(sock: socket.socket) -> bool:
    """Whether `sock` is a plain socket (TLS sockets have neither sendmsg nor recv flags)."""
    return type(sock).sendmsg is socket.socket.sendmsg
