"""The agent's local HTTP API: a small asyncio HTTP/1.1 server (``http``), the request and
response tensor encodings (``codec``) and the routes (``app``)."""
