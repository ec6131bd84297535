"""HTTP/1.1: uvicorn's h11 protocol, strict framing, the head timeout, and the long-poll fast path.

``StrictH11Connection`` refuses the request heads RFC 9112 says a server must not read leniently;
``HeadTimeoutH11Protocol`` bounds the time to read a head; ``LongPollH11Protocol`` answers the
long-poll route itself (pipelined, shared answer bytes), with coalesced idle timers for bursts.
"""
