"""Answers waiting to be written: the process-wide answer budget (``service.answer_budget_bytes``).

An answer a client does not read at once stays with its connection; the budget bounds the bytes
held that way across every protocol (HTTP/1.1, HTTP/2, the ASGI route) and refuses new long polls
with 429 ``MEMORY_BUDGET_EXCEEDED`` while it is spent.
"""
