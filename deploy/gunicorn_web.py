"""gunicorn settings for the web tier (pages and the public API): gunicorn -c deploy/gunicorn_web.py config.wsgi

Sized from docs/capacity.md: a request costs CPU (templates, serializers, SQL round trips), so
workers follow cores; threads cover the time spent waiting on PostgreSQL and Redis.
"""

import multiprocessing
import os

bind = os.environ.get("WEB_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_WORKERS", multiprocessing.cpu_count() * 2 + 1))
threads = int(os.environ.get("WEB_THREADS", "4"))
worker_class = "gthread"
timeout = int(os.environ.get("WEB_TIMEOUT", "30"))  # a request past this is a bug, not load
graceful_timeout = 30
keepalive = 5
max_requests = 5000  # recycle workers slowly, against leaks
max_requests_jitter = 500
backlog = 2048
# The load balancer sets X-Forwarded-For; the portal believes it only from TRUSTED_PROXIES.
forwarded_allow_ips = os.environ.get("TRUSTED_PROXIES", "127.0.0.1")
accesslog = "-"
errorlog = "-"
