"""Answers: what every protocol (the ASGI route, HTTP/1.1, HTTP/2) answers with, and what it may hold.

A finished long poll's answer rendered once per operation — body, HTTP/1.1 bytes, HTTP/2 frames —
and shared by every waiter and protocol answered with it (``SharedAnswers``, ``_shared``); the
request errors (a status and a JSON body naming the field at fault);
the process-wide answer budget (``service.answer_budget_bytes``), which bounds the bytes of
answers waiting for slow readers and refuses new long polls with 429 ``MEMORY_BUDGET_EXCEEDED``
while it is spent.
"""
