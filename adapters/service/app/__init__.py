"""The ASGI app (Starlette) and what it serves requests with.

The routes (``create_app``), the parsing of a request's query and body, the JSON errors, who may
call (authentication, the topic policy), the guards around the app (request-head limits, the
catch-all 500), the service's metrics, and the ``Gateway`` that turns requests into the Kafka
adapter's delayed operations. The protocol fast paths (``http``) serve the long-poll route below
this app; everything else comes here.
"""
