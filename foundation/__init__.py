"""The plumbing every app builds on, at the bottom of the layering: it imports nothing of ours.

Bulk SQL helpers and compiled reads (`db`), the Redis cache backend (`cache`), the rate gate
(`ratelimit`), the after-commit Redis batch (`redis_after_commit`), JSON rendering and parsing
(`fastjson`), plain parsers (`plainparse`, `params`), the PostgreSQL backend (`db_backends`),
pushed page updates (`push`), locks (`locks`), client addresses (`clientip`) and queueing a
Celery task by name (`enqueue`). Not an app: no models, no templates.

It is also the fast-path fence: compiled reads, raw SQL and Lua live here, or in a module
listed in tests/unit/test_fast_paths_fenced.py that cites its benchmark (docs/architecture.md,
"Fast paths").
"""
