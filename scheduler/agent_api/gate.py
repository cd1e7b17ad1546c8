"""What an agent's request needs from the cache before its view runs, in one Redis round trip.

Every agent request needs three answers from the cache: which node its token names
(`nodes.agent_token_key`), one hit counted in that node's throttle window (`foundation.ratelimit`),
and — for a sync — the node's assignment version (`dispatch.version_key`). Asked one by one they
are three round trips, and the idle sync, the agents' most frequent request, needs nothing else.
Here one Lua script answers all three: the node id it reads names the other two keys.

A token the cache does not vouch for (never seen, expired, forgotten on reissue or retirement)
is looked up in the database as before; caches other than Redis (the embedded file cache) take
the three answers one by one, as `tests/embedded` checks.

Fast path, justified by `bench.agent_requests` (docs/benchmarks.md, "Agent requests"), which
times the agents' requests with the three answers asked one by one instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from redis.commands.core import Script

from foundation.ratelimit import window_hit, window_of
from scheduler import dispatch, nodes

_NODE = "<node>"  # stands for the node id in the key templates the script completes

# KEYS[1]: the token's key. ARGV: the throttle window's key around the node id (1, 2), the
# window's time to live ('' : no throttle), the version's key around the node id (4, 5).
# The script names keys it reads from the token's value, so it runs on one Redis, not a cluster.
_LOOKUP = Script(
    None,  # type: ignore[arg-type]  # a client is given per call; bytes need none to encode
    b"""
local node = redis.call('GET', KEYS[1])
if not node or not string.match(node, '^%d+$') then return false end
local hits = false
if ARGV[3] ~= '' then
  local window = ARGV[1] .. node .. ARGV[2]
  hits = redis.call('INCR', window)
  redis.call('EXPIRE', window, ARGV[3])
end
return {node, hits, redis.call('GET', ARGV[4] .. node .. ARGV[5])}
""",
)


@dataclass(frozen=True)
class AgentThrottleWindow:
    """The agent throttle's key for a node (`key_for(node_id)`) and its period in seconds."""

    key_template: str  # with `%(ident)s` for the node id
    period: int

    def key_for(self, node_id: int | str) -> str:
        return self.key_template % {"ident": node_id}


@dataclass(frozen=True)
class AgentLookup:
    """A valid token's node, with its throttle hit counted and its assignment version read."""

    node_id: int
    token_hash: str
    throttle_hits: int | None  # hits in the current window, this one included; None: no limit
    retry_after: int  # seconds until that window ends
    assignments_version: str | None


def agent_lookup(raw_token: str, *, throttle: AgentThrottleWindow | None) -> AgentLookup | None:
    """The node this agent token names (None: no valid token), counting one throttle hit."""
    if not raw_token.startswith(nodes.AGENT_TOKEN_PREFIX) or len(raw_token) > 200:
        return None
    token_hash = nodes.agent_token_hash(raw_token)
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        found = _in_one_round_trip(backend, token_hash, throttle)
        if found is not None:
            return found
    known = nodes.node_id_for_agent_token(raw_token)
    if known is None:
        return None
    node_id = known[0]
    hits, retry_after = (
        window_hit(throttle.key_for(node_id), throttle.period) if throttle else (None, 0)
    )
    return AgentLookup(
        node_id, token_hash, hits, retry_after, dispatch.assignments_version(node_id)
    )


def _around_node(backend: RedisCache, key: str) -> tuple[str, str] | None:
    """The cache's full key for `key`, split around its node id (None: the key function
    does not keep the key as it is, so the script cannot build it)."""
    before, node, after = backend.make_key(key).partition(_NODE)
    return (before, after) if node else None


def _in_one_round_trip(
    backend: RedisCache, token_hash: str, throttle: AgentThrottleWindow | None
) -> AgentLookup | None:
    """The lookup by `_LOOKUP`; None when the cache does not know the token (or its key
    function hides the node id, which the script could then not fill in)."""
    version_key = _around_node(backend, dispatch.version_key(_NODE))
    window_key: tuple[str, str] | None = ("", "")
    window_ttl, retry_after = "", 0  # no throttle: the script counts nothing
    if throttle is not None:
        window, retry_after = window_of(throttle.key_for(_NODE), throttle.period)
        window_key, window_ttl = _around_node(backend, window), str(throttle.period + 1)
    if version_key is None or window_key is None:
        return None
    token_key = backend.make_and_validate_key(nodes.agent_token_key(token_hash))
    answer = _LOOKUP(
        keys=[token_key],
        args=[*window_key, window_ttl, *version_key],
        client=backend._cache.get_client(token_key, write=True),
    )
    if not answer:
        return None
    node, hits, version = answer
    serializer = backend._cache._serializer  # type: ignore[attr-defined]  # Django's own
    loaded = serializer.loads(version) if version is not None else None
    return AgentLookup(
        int(node),
        token_hash,
        int(hits) if hits is not None else None,
        retry_after,
        loaded if isinstance(loaded, str) else None,
    )
