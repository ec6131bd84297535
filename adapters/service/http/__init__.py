"""The wire: the service's own HTTP/1.1 and HTTP/2 protocols under uvicorn (the fast paths).

``h1`` is uvicorn's h11 protocol made strict (framing, a bound on reading a head) with the
long-poll route served below the ASGI app; ``h2`` is HTTP/2 with prior knowledge on the same port.
Both serve a long poll as a waiter without a task and hand every other request to the app.
"""
