"""gunicorn settings for the events service (pushed page updates): gunicorn -c deploy/gunicorn_events.py config.asgi_events

An open page holds one server-sent event stream for as long as it is open. Under the web tier's
sync (gthread) workers each would hold a thread; here each is a coroutine of a uvicorn worker
(an async Django view, web/events.py), and each worker has one Redis subscription for all its
streams. A stream costs memory and a file descriptor, little CPU: a couple of workers serve
thousands of open pages (docs/benchmarks.md, "Pushed page updates").
"""

import os

bind = os.environ.get("EVENTS_BIND", "0.0.0.0:8002")
workers = int(os.environ.get("EVENTS_WORKERS", "2"))
worker_class = "uvicorn_worker.UvicornWorker"
# Streams end by themselves after PUSH_STREAM_MAX_S (browsers reconnect); a worker that does
# not answer its heartbeat for this long is restarted.
timeout = int(os.environ.get("EVENTS_TIMEOUT", "30"))
graceful_timeout = 10  # open streams are cut at shutdown; browsers reconnect to another worker
keepalive = 5
max_requests = 0  # a recycled worker would cut every stream it holds
backlog = 2048
forwarded_allow_ips = os.environ.get("TRUSTED_PROXIES", "127.0.0.1")
accesslog = "-"
errorlog = "-"
