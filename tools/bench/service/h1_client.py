"""The HTTP/1.1 client of ``purgatory bench fanout``: N long polls, each answer read whole and timed.

Why not asyncio protocols: the client shares the machine's two cores with the service, and its
cost per answer is in the answer times. Reading 10,000 answers through asyncio's selector loop
(a ready handle per socket, ``recv`` of a fresh 256 KiB buffer, ``data_received``) cost 12-16 µs
of client CPU per answer (``cli/ans``) — more than a third of the service's. Here the
connections are opened on the bench's event loop (``sock_connect``, the request sent whole), and
then one thread reads every answer from one ``epoll`` set with ``recv_into`` a shared buffer.

Still honest: every answer is read in full (the head to its blank line, then ``Content-Length``
bytes of body), its status and body are kept for the bench's checks, and its time is taken when
its last byte was read. A connection the service closes without an answer counts as such
(status -1), as before. Connections stay open after their answer (a consumer would poll again on
them; closing them made the service tear sockets down while still answering the rest).

Concurrency contract: :func:`open_long_polls` runs on the bench's event loop; :class:`AnswerReader`
then owns the sockets' reading on its own thread until :meth:`AnswerReader.join` returns (the
event loop does not read them); :meth:`H1LongPoll.close` after that.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

__all__ = ["AnswerReader", "H1LongPoll", "open_long_polls"]

CONNECTIONS_PER_SOURCE_IP = 20_000  # under the 28k ephemeral ports of one (source IP, port 0) bind
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux >= 4.2
CONNECT_CONCURRENCY = 256  # connects in flight: below the listen backlog, so no SYN is dropped
READ_BUFFER_BYTES = 64 * 1024  # one answer (a few hundred bytes) or a large error fits at once
CONTENT_LENGTH = b"\r\ncontent-length:"
EPOLL_WAIT_S = 0.2  # how often the reader looks at its deadline and its stop flag while idle


class H1LongPoll:
    """One HTTP/1.1 GET on its own connection: when (and with what) it was answered."""

    __slots__ = ("answered_ns", "body", "buffer", "partition", "sock", "status")

    def __init__(self, sock: socket.socket, partition: int) -> None:
        self.sock = sock
        self.partition = partition
        self.buffer = b""  # a partial answer (rare: one read holds the whole of one)
        self.status = 0
        self.body = b""
        self.answered_ns = 0

    def received(self, data: bytes, now_ns: int) -> bool:
        """Add the bytes read; True once the whole response is in (status, body and time set)."""
        if self.buffer:
            data = self.buffer + data
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            self.buffer = data
            return False
        # The framing field, found in the lowercased head (field names are case-insensitive).
        head = data[:head_end].lower()
        at = head.find(CONTENT_LENGTH)
        if at < 0:
            length = 0
        else:
            stop = head.find(b"\r\n", at + len(CONTENT_LENGTH))
            length = int(head[at + len(CONTENT_LENGTH) : stop if stop >= 0 else head_end])
        end = head_end + 4 + length
        if len(data) < end:
            self.buffer = data
            return False
        self.answered_ns = now_ns
        self.status = int(data[9:12])  # b"HTTP/1.1 200 ..."
        self.body = data[head_end + 4 : end]
        self.buffer = b""
        return True

    def closed(self, now_ns: int) -> None:
        """The connection ended (or failed) before a whole answer: answered with status -1."""
        self.answered_ns = now_ns
        self.status = -1

    def close(self) -> None:
        self.sock.close()


async def open_long_polls(
    port: int,
    topic: str,
    waiters: int,
    partitions: int,
    max_wait_ms: int,
    offset: int = 0,
    *,
    connection_close: bool = False,
    resource: str = "records",
) -> list[H1LongPoll]:
    """Connect ``waiters`` sockets and send their long polls at ``offset`` (waiter i: partition
    i % partitions); with ``connection_close``, each asks the service to close after its answer;
    ``resource="stream"``: event streams from ``offset`` instead."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    polls: list[H1LongPoll] = []
    query = f"offset={offset}" + (f"&max_wait_ms={max_wait_ms}" if resource == "records" else "")

    async def open_one(i: int) -> None:
        partition = i % partitions
        request = (
            f"GET /topics/{topic}/partitions/{partition}/{resource}?{query} "
            "HTTP/1.1\r\nHost: 127.0.0.1\r\n" + ("Connection: close\r\n" if connection_close else "") + "\r\n"
        ).encode()
        source = f"127.0.0.{2 + i // CONNECTIONS_PER_SOURCE_IP}"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Choose the source port at connect(), not at bind(): bind(port 0) searches the ports in
        # use and slows down quadratically past ~10k sockets (33 s for 10,000 measured).
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((source, 0))
        sock.setblocking(False)
        polls.append(H1LongPoll(sock, partition))
        async with gate:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, request)

    await asyncio.gather(*(open_one(i) for i in range(waiters)))
    return polls


class AnswerReader:
    """One thread reading every poll's answer from one ``epoll`` set (module docstring).

    Runs from :meth:`start` until every poll is answered, :meth:`stop` is called, or the
    deadline passes. A socket stays in the set after its answer (taking it out is a system call
    per answer); should it become readable again (the service closing it after its keep-alive
    timeout), it is taken out then.
    """

    def __init__(self, polls: list[H1LongPoll], deadline: float) -> None:
        self._polls = {poll.sock.fileno(): poll for poll in polls}
        self._deadline = deadline  # time.monotonic()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fanout-answer-reader", daemon=True)
        self.unanswered = sum(1 for poll in polls if not poll.answered_ns)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self) -> None:
        """Wait for the reader to end (every poll answered, stopped, or past the deadline)."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError("the answer reader failed") from self._error

    def _run(self) -> None:
        try:
            self._read()
        except BaseException as exc:  # handed to join(): the bench reports it
            self._error = exc

    def _read(self) -> None:
        polls = self._polls
        buffer = bytearray(READ_BUFFER_BYTES)
        view = memoryview(buffer)
        with select.epoll() as epoll:
            for fd in polls:
                epoll.register(fd, select.EPOLLIN)
            while self.unanswered and not self._stopping.is_set():
                left = self._deadline - time.monotonic()
                if left <= 0:
                    return
                for fd, _ in epoll.poll(min(left, EPOLL_WAIT_S), len(polls)):
                    poll = polls[fd]
                    try:
                        n = poll.sock.recv_into(buffer)
                    except BlockingIOError:
                        continue
                    except OSError:
                        n = 0
                    if poll.answered_ns:
                        epoll.unregister(fd)  # readable again after its answer: closed or extra bytes
                        continue
                    if n == 0:
                        epoll.unregister(fd)
                        poll.closed(time.monotonic_ns())
                        self.unanswered -= 1
                    elif poll.received(bytes(view[:n]), time.monotonic_ns()):
                        self.unanswered -= 1
