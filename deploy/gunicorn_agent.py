"""gunicorn settings for the agent API pool: gunicorn -c deploy/gunicorn_agent.py config.wsgi_agent

Its own port and workers: the load balancer sends /api/agent/ here and nothing else, so user
traffic can never queue in front of a heartbeat. A heartbeat or idle sync costs a few
milliseconds (docs/capacity.md), so few workers carry thousands of nodes.
"""

import os

bind = os.environ.get("AGENT_API_BIND", "0.0.0.0:8001")
workers = int(os.environ.get("AGENT_API_WORKERS", "3"))
threads = int(os.environ.get("AGENT_API_THREADS", "8"))
worker_class = "gthread"
timeout = 15  # agents retry; a stuck request must not hold a worker long
graceful_timeout = 15
keepalive = 30  # agents keep their connection open between syncs
max_requests = 20000
max_requests_jitter = 2000
backlog = 4096
forwarded_allow_ips = os.environ.get("TRUSTED_PROXIES", "127.0.0.1")
accesslog = "-"
errorlog = "-"
