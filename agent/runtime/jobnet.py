"""The network fence of gang members in containers: the host's network, minus everything else.

A gang's members must reach each other: rank 0's rendezvous (`MASTER_ADDR:MASTER_PORT`) and the
further connections gloo and NCCL open between ranks, on ports each rank picks. So a gang
member's container shares the node's network namespace (`--network=host`, as NCCL over TCP or
InfiniBand wants anyway), and this nftables table fences every socket of a job uid
(`uid_base` .. + `JOB_UID_RANGE`) on the node's output hook:

- a job opens TCP only: anything else it sends to an address of this host is dropped, and so
  is anything it sends to another host outside the gang networks (`AGENT_GANG_NETWORKS`, the
  addresses other nodes' jobs have; none by default: then only members on this host meet);
- a TCP connection a job opens to an address of this host completes only when the socket that
  answers belongs to the same uid. Each SYN a job sends is remembered (`conntrack id . uid`,
  for the length of a handshake); the answer to it (SYN-ACK, or a reset from a closed port) is
  dropped unless it comes from a socket of that very uid. A gang's members run as the same uid
  on every node (`job_uid` of the job's id), so they meet; Redis, PostgreSQL, the agent API,
  the portal and any other service on the host answer as other uids, and another job as
  another uid, so their answers never reach the job: the connection times out;
- a job's socket answers other hosts only within the gang networks.

What no packet filter sees: abstract Unix sockets (`@name`) belong to the network namespace, so a
gang member could reach a host daemon listening on one; the agent warns naming them when it
installs the fence (`abstract_listeners`), and a node should run none.

The table is the node's, one per uid range (`gpucloud_jobnet_<base>`), installed at once and
whole (`nft -f`), and left in place when the agent stops (it only narrows what job uids may
do). Every agent on the host installs it when it is missing or differs, and checks it before
each gang member starts: a member whose fence is not there does not start.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

from agent.runtime.base import JOB_UID_RANGE

log = logging.getLogger(__name__)

MARK = "gpucloud-jobnet"


def table_name(uid_base: int) -> str:
    return f"gpucloud_jobnet_{uid_base}"


def parse_networks(raw: Iterable[str]) -> tuple[str, ...]:
    """The gang networks as CIDRs; ValueError naming a bad one."""
    out = []
    for item in raw:
        item = item.strip()
        if not item:
            continue
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError as exc:
            raise ValueError(f"not a network: {item!r} ({exc})") from exc
    return tuple(out)


def ruleset(uid_base: int, networks: Iterable[str] = ()) -> tuple[str, str]:
    """The table as `nft -f` reads it, and the digest of its rules (in its chain comment)."""
    low, high = uid_base, uid_base + JOB_UID_RANGE - 1
    nets = [ipaddress.ip_network(n) for n in networks]
    v4 = ", ".join(str(n) for n in nets if n.version == 4)
    v6 = ", ".join(str(n) for n in nets if n.version == 6)
    body = f"""
  set opened {{
    typeof ct id . meta skuid
    flags dynamic,timeout
    timeout 5m
    size 262144
  }}
  set jobconns {{
    typeof ct id
    flags dynamic,timeout
    timeout 5m
    size 262144
  }}
  set gang4 {{
    type ipv4_addr
    flags interval
    {f"elements = {{ {v4} }}" if v4 else ""}
  }}
  set gang6 {{
    type ipv6_addr
    flags interval
    {f"elements = {{ {v6} }}" if v6 else ""}
  }}
  chain opens {{
    meta l4proto != tcp drop
    fib daddr type != local jump elsewhere
    add @opened {{ ct id . meta skuid }}
    add @jobconns {{ ct id }}
    accept
  }}
  chain elsewhere {{
    ip daddr @gang4 accept
    ip6 daddr @gang6 accept
    drop
  }}
  chain answers {{
    ct id . meta skuid @opened accept
    drop
  }}"""
    rules = f"""
    meta skuid {low}-{high} ct state invalid,untracked drop
    meta skuid {low}-{high} ct direction original ct state new jump opens
    meta skuid {low}-{high} ct direction reply fib daddr type != local jump elsewhere
    ct direction reply ct status ! assured ct id @jobconns jump answers"""
    digest = hashlib.sha256((body + rules).encode()).hexdigest()[:16]
    name = table_name(uid_base)
    text = f"""table inet {name} {{
{body}
  chain output {{
    type filter hook output priority filter; policy accept;
    comment "{MARK} {digest}"{rules}
  }}
}}
"""
    return text, digest


def abstract_listeners(proc_net_unix: Path = Path("/proc/net/unix")) -> list[str]:
    """Abstract Unix sockets listening in this network namespace (`@name`): the node's network
    namespace shares them with gang members, and no packet filter sees them."""
    try:
        lines = proc_net_unix.read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening
        if len(fields) >= 8 and fields[7].startswith("@") and int(fields[3], 16) & 0x10000:
            found.append(fields[7])
    return sorted(set(found))


class JobNetwork:
    """The fence on this node: `ensure()` installs it when missing or different, and says why
    it cannot be had (None when it is in place)."""

    def __init__(self, *, uid_base: int, networks: Iterable[str] = (), nft: str = "nft") -> None:
        self.uid_base = uid_base
        self.networks = parse_networks(networks)
        self.nft = shlex.split(nft)
        self.table = table_name(uid_base)
        self.text, self.digest = ruleset(uid_base, self.networks)

    def _nft(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - the configured nft, our own arguments
            [*self.nft, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )

    def in_place(self) -> bool:
        try:
            done = self._nft("list", "chain", "inet", self.table, "output")
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and f"{MARK} {self.digest}" in done.stdout

    def ensure(self) -> str | None:
        """Install the table unless it is in place; None when it is, else why not."""
        if self.in_place():
            return None
        # One transaction: the old table (if any) goes and the new one comes at once.
        script = f"table inet {self.table}\ndelete table inet {self.table}\n{self.text}"
        try:
            done = self._nft("-f", "-", stdin=script)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"nft could not run ({' '.join(self.nft)}): {exc}"
        if done.returncode != 0:
            return f"nft refused the fence: {done.stderr.strip()[-300:]}"
        if not self.in_place():
            return "the fence was installed but is not in place (another firewall replaced it?)"
        log.info(
            "job network fence in place: nftables table inet %s (uids %d-%d, gang networks: %s)",
            self.table,
            self.uid_base,
            self.uid_base + JOB_UID_RANGE - 1,
            ", ".join(self.networks) or "none",
        )
        exposed = abstract_listeners()
        if exposed:
            log.warning(
                "abstract Unix sockets listen on this node (%s): gang members share the node's "
                "network namespace and can reach them; no packet filter fences them",
                ", ".join(exposed[:5]) + (" ..." if len(exposed) > 5 else ""),
            )
        return None
