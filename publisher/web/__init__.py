"""A Source's web app: its topic URI answering (aiohttp, ASGI, WSGI), Flask and Django glue,
and changes taken in a request and sent after it."""
