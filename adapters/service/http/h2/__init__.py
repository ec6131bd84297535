"""HTTP/2 with prior knowledge (h2c) beside HTTP/1.1 on the service's port.

Preface sniffing (``H2PriorKnowledge``), the patched ``h2`` connection, what a client's bytes may
cost before ``h2`` parses them (inbound frame and header limits), the abuse limits (rapid reset,
control-frame floods), long polls answered with shared frames, and the bridge to the ASGI app for
every other request.
"""
