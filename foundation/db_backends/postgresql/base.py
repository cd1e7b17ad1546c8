"""Django's PostgreSQL backend with a health check that costs no round trip.

With persistent connections and `CONN_HEALTH_CHECKS`, Django checks the connection at the first
query of every request, and Django's PostgreSQL backend checks by running `SELECT 1`: a round
trip to the server on every request (every submission, agent sync and heartbeat), and about
2.5 % of a web worker's CPU in profiles. Whether a connection can still be used is mostly known
on the client without asking the server:

- psycopg has not closed it and has not marked it broken, libpq's status is OK, and no
  transaction is aborted or half-read (`SELECT 1` fails in those states too);
- its socket has nothing to read. Between requests the protocol is idle: the server speaks only
  when asked, so an idle connection has nothing pending. A backend the server ended
  (`pg_terminate_backend`, a restart or failover, `idle_session_timeout`, a pooler that closed
  it) sent its FATAL message and closed the socket, so the socket is readable (data, end of
  file, or a reset) and the connection is not used again: Django closes it and connects afresh,
  exactly as when `SELECT 1` fails. Anything else that makes an idle socket readable (a NOTIFY
  for a LISTEN, which the portal does not use) only costs a reconnection.

Fast path, justified by `bench.fast_paths` (the check 45x as fast as Django's `SELECT 1` on an
idle connection, at the first query of every request).

redis-py checks its pooled connections the same way. `select.poll` because a process may hold
file descriptors above `select.select`'s limit of 1024.

What neither check catches at once: a silent network partition (the server's host or a
middlebox gone without a FIN or a reset). Nothing arrives, so the socket looks idle and this
check passes; `SELECT 1` would not fail promptly either, it would hang until the kernel's TCP
timeouts (keepalives, `tcp_user_timeout`) declared the connection dead. Here the request's first
query hangs and fails that way instead, that request errors, and Django, which closes a
connection after an error that leaves it unusable, gives the next request a fresh one.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import is_psycopg3

if is_psycopg3:
    import psycopg
    from psycopg import pq

    _CONNECTION_OK = pq.ConnStatus.OK
    # Idle, or inside a transaction between statements. Not ACTIVE (a statement's results are
    # still on the wire), INERROR (an aborted transaction) or UNKNOWN (a bad connection).
    _USABLE_TRANSACTION_STATUS = frozenset(
        {pq.TransactionStatus.IDLE, pq.TransactionStatus.INTRANS}
    )


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None:
            return False
        if not is_psycopg3:
            return bool(super().is_usable())  # psycopg2: Django's SELECT 1
        if conn.closed or conn.broken:
            return False
        pgconn = conn.pgconn
        if pgconn.status != _CONNECTION_OK:
            return False
        if pgconn.transaction_status not in _USABLE_TRANSACTION_STATUS:
            return False
        try:
            fd = pgconn.socket
        except psycopg.OperationalError:  # libpq has no socket: the connection is lost
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        # Readable (POLLIN), or closed or failed (POLLHUP, POLLERR, reported unasked): the
        # server has spoken or hung up on an idle connection, so it is over.
        return not poller.poll(0)
