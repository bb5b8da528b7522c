"""The OpenAI-compatible HTTP front end: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health`` and ``/metrics`` over the scheduler's gRPC API.

It is a client of the scheduler like the SDK (one gRPC channel, a request per HTTP request),
so it runs beside the scheduler or on its own host: ``python -m openai_svc --scheduler ADDR``
or ``fastserve serve --http-port 8000``. The scheduler stays the one place that validates
values, authenticates keys (the HTTP ``Authorization`` header is passed on as gRPC metadata)
and owns requests; this service translates shapes and status codes.

| file          | job                                                                 |
|---------------|---------------------------------------------------------------------|
| protocol.py   | OpenAI request bodies (pydantic) -> a ``GenerateRequest``           |
| errors.py     | OpenAI's error JSON; gRPC status -> HTTP status                     |
| responses.py  | Final and chunks -> OpenAI response objects and SSE events          |
| app.py        | the FastAPI routes, disconnects, metrics                            |
| __main__.py   | the command line: uvicorn, TLS, the ready line                      |
"""
