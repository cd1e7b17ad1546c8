"""The agent's main loop: register, then heartbeat, poll assignments, run them, report.

Two threads talk to the portal, each over a connection of its own. The main thread drives the
work in short ticks (`Agent.tick`): reap and ship reports, sync, apply assignments. The
heartbeat thread (`Agent.beat_loop`) samples the GPUs at 1 Hz and sends the heartbeats, so a
slow or retrying sync never delays the node's liveness (as Kubernetes renews a node's lease
apart from its status). The heartbeat thread reads what runs from a view the main thread
publishes after each change (`RunnerView`), never the runner itself, and hands what the
portal answers (fenced, images to keep) back to the main thread, which acts on it; only the
log pipe readers have threads besides. `Agent(config).run(stop_event)` runs in-process until
the event is set, then stops all work (SIGTERM, grace, SIGKILL; heartbeats go on meanwhile),
stops the heartbeat thread and reports the exits before it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from agent.client import (
    Backoff,
    Conflict,
    PortalClient,
    PortalError,
    PortalUnavailable,
    RequestRejected,
    Unauthorized,
)
from agent.config import Config
from agent.gpus import TELEMETRY_KEYS, GpuBackend, select_backend
from agent.protocol import MAX_HEARTBEAT_SAMPLES, MAX_SAMPLE_PROCESSES
from agent.runner import (
    LEFTOVER_GRACE_S,
    READER_DRAIN_S,
    Assignment,
    AssignmentError,
    Message,
    Runner,
    agent_source_root,
    stop_reason_to_exit_reason,
)
from agent.runtime import ContainerRuntime, ProcessRuntime, Runtime, engine_available
from agent.runtime.base import DEFAULT_JOB_UID_BASE
from agent.runtime.jobnet import JobNetwork
from agent.runtime.mps import MpsControl
from agent.watch import Watch

log = logging.getLogger("agent")

SHUTDOWN_REPORT_ATTEMPTS = 3
SYNC_BATCH = 200  # started/exited reports per sync round trip
SYNC_KINDS = frozenset({"started", "exited"})
MIN_INTERVAL_S = 0.05  # whatever the portal answers, the agent does not spin
SAMPLE_INTERVAL_S = 1.0  # GPUs are sampled at 1 Hz; each heartbeat carries what accumulated
MAX_BUFFERED_INSTANTS = 30  # kept while the portal is unreachable; the oldest are dropped


def host_resources() -> tuple[int, int]:
    """(cpu_milli, memory_mib) of this host, as the portal's node inventory wants them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        memory = 0
    return cpus * 1000, int(memory)


@dataclass(frozen=True)
class RunnerView:
    """What the runner runs, as the heartbeat thread may read it: published by the main
    thread after each round, immutable once published."""

    running: list[dict[str, Any]] = field(default_factory=list)
    busy_gpus: frozenset[str] = frozenset()
    processes_by_gpu: dict[str, list[int]] = field(default_factory=dict)


class RuntimeUnavailable(SystemExit):
    """The configured workload runtime cannot run here: the agent does not start."""


def build_runtime(config: Config, *, simulated: bool) -> Runtime:
    """The workload runtime the configuration asks for (the container runtime by default)."""
    mps = None if simulated else MpsControl()
    if config.runtime == "process":
        log.warning("the process runtime is for demos and development: jobs are not contained")
        return ProcessRuntime(uid_base=config.job_uid_base or None, mps=mps)
    if not engine_available(config.engine):
        raise RuntimeUnavailable(
            f"the container engine ({config.engine}) does not answer: install Podman, or "
            "choose the process runtime for a demo (AGENT_RUNTIME=process)"
        )
    uid_base = config.job_uid_base or None
    network = JobNetwork(
        uid_base=uid_base if uid_base is not None else DEFAULT_JOB_UID_BASE,
        networks=config.gang_networks,
        nft=config.nft,
    )
    reason = network.ensure()
    if reason is not None:
        log.warning(
            "gang members cannot run in containers on this node: the job network fence is not "
            "in place (%s); single-node jobs run as before",
            reason,
        )
    return ContainerRuntime(
        engine=config.engine,
        default_image=config.default_image,
        uid_base=uid_base,
        cpu_milli_per_gpu=config.cpu_milli_per_gpu,
        memory_mib_per_gpu=config.memory_mib_per_gpu,
        pids_limit=config.pids_limit,
        gpu_devices=not simulated,
        agent_source=agent_source_root(),
        node_label=config.hostname,
        mps=mps,
        network=network,
    )


def _portal_client(config: Config) -> PortalClient:
    """A client of the portal with its own connection, as the config says."""
    return PortalClient(
        config.portal_url,
        config.token,
        timeout_s=config.request_timeout_s,
        backoff_initial_s=config.backoff_initial_s,
        backoff_max_s=config.backoff_max_s,
        ca_bundle=config.ca_bundle,
    )


class Agent:
    """One node's agent. Construct it, then `run(stop_event)` (blocks until the event is set)."""

    def __init__(
        self,
        config: Config,
        *,
        backend: GpuBackend | None = None,
        client: PortalClient | None = None,
        beat_client: PortalClient | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.config = config
        self.backend = backend or select_backend(
            simulate=config.simulate,
            sim_gpus=config.sim_gpus,
            hostname=config.hostname,
            seed=config.sim_seed,
        )
        self.client = client or _portal_client(config)
        # The heartbeat's own client: its own connection, so a sync in flight (or stuck in its
        # retries) on the main client's never holds a heartbeat back.
        self.beat_client = beat_client or _portal_client(config)
        self.runner = runner or Runner(
            config.workdir,
            log_flush_s=config.log_flush_s,
            runtime=build_runtime(config, simulated=self.backend.simulated),
            shared_root=config.shared_root or None,
            project_gid_base=config.project_gid_base,
            quota_interval_s=config.quota_interval_s,
            volume_images=config.volume_images,
        )
        self.node: str | None = None
        self._gpu_uuids: set[str] = set()
        self.heartbeat_interval_s = (
            config.heartbeat_interval_s or Config.DEFAULT_HEARTBEAT_INTERVAL_S
        )
        self.poll_interval_s = config.poll_interval_s or Config.DEFAULT_POLL_INTERVAL_S
        self.connected = False
        self.fenced = False
        self._fence_draining = False
        self._reconcile = True
        self._next_contact = 0.0
        self._next_poll = 0.0
        self._buffer: list[tuple[float, list[dict[str, Any]]]] = []  # (monotonic, records)
        # Between the main thread and the heartbeat thread: the runner as last published, the
        # sample buffer (and the GPU backend), one heartbeat at a time, and what a heartbeat's
        # answer asks of the main thread (fenced or not, the images to keep pulled).
        self._view = RunnerView()
        self._sample_lock = threading.Lock()
        self._beat_lock = threading.Lock()
        self._news_lock = threading.Lock()
        self._beat_news: dict[str, Any] = {}
        self._beat_stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self.beats_answered = 0  # heartbeats the portal answered (for tests and logs)
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        # The portal's /sync: reports and assignments in one round trip; an unchanged version
        # is answered without the assignments. False: an older portal, one request per report.
        self._sync_supported = True
        self._version: str | None = None
        # The watch (agent/watch.py): a wake-up makes the next round poll at once; while the
        # watch is live, polls are a slow fallback.
        self._wake = threading.Event()
        self._poll_due = False
        self.watch = (
            Watch(
                config.events_url or config.portal_url,
                config.token,
                on_change=self._assignments_changed,
                ca_bundle=config.ca_bundle,
            )
            if config.watch
            else None
        )
        self._assignments: list[Assignment] = []
        self._unreadable: set[tuple[int, int]] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Register, then loop until `stop` is set; then stop all work and report it."""
        self.client.stop = stop
        self.beat_client.stop = self._beat_stop
        try:
            leftovers = self.runner.kill_leftovers()
            if leftovers:
                log.warning("stopped %d attempt(s) a previous agent left running", len(leftovers))
            self.runner.sweep()  # what a crashed agent left on disk
            if not self.register(stop):
                return
            self.publish()
            self._beat_thread = threading.Thread(
                target=self.beat_loop, name="heartbeat", daemon=True
            )
            self._beat_thread.start()
            if self.watch is not None:
                threading.Thread(
                    target=self.watch.run, args=(stop,), name="watch", daemon=True
                ).start()
            while not stop.is_set():
                try:
                    self.tick()
                except Exception:  # a bug in one round must not take the node's work down
                    log.exception("unexpected error in the agent loop; carrying on")
                    stop.wait(1.0)
                self._wake.wait(self.pause())  # a tick at most: `stop` is seen within one
                self._wake.clear()
        finally:
            if self.watch is not None:
                self.watch.close()
            self.shutdown()

    def registration(self) -> dict[str, Any]:
        inventory = self.backend.inventory()
        cpu_milli, memory_mib = host_resources()
        return {
            "hostname": self.config.hostname,
            "address": self.config.address or self.config.hostname,
            "simulated": bool(inventory.get("simulated")),
            "driver_version": inventory.get("driver_version"),
            "cuda_version": inventory.get("cuda_version"),
            "cpu_milli": cpu_milli,
            "memory_mib": memory_mib,
            "gpus": inventory.get("gpus", []),
            **self.gang_members(),
        }

    def gang_members(self) -> dict[str, Any]:
        """Whether this node can run a member of a multi-node gang, as registration says it."""
        reason = self.runner.runtime.gang_members()
        if reason is None:
            return {"gang_members": True}
        log.warning("registering as a node that cannot run gang members: %s", reason)
        return {"gang_members": False, "gang_members_reason": reason[:300]}

    def register(self, stop: threading.Event) -> bool:
        """POST /register until the portal accepts it (True) or `stop` is set (False)."""
        body = self.registration()
        log.info(
            "registering %s with %s: %d GPU(s)%s",
            self.config.hostname,
            self.config.portal_url,
            len(body["gpus"]),
            " (simulated)" if body["simulated"] else "",
        )
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        while not stop.is_set():
            try:
                answer = self.client.register(body)
            except PortalUnavailable:
                return False  # only when stopped: attempts are unlimited here
            except Unauthorized as exc:
                log.error(
                    "the portal rejected this node's token (HTTP %s): check NODE_TOKEN / "
                    "NODE_TOKEN_FILE; retrying in %.0fs",
                    exc.status,
                    self.config.unauthorized_backoff_s,
                )
                stop.wait(self.config.unauthorized_backoff_s)
                continue
            except PortalError as exc:
                delay = max(backoff.next(), self.config.backoff_max_s / 2)
                log.error("registration refused: %s; retrying in %.0fs", exc, delay)
                stop.wait(delay)
                continue
            self.node = str(answer.get("node") or self.config.hostname)
            self._gpu_uuids = {str(g["uuid"]) for g in body["gpus"]}
            if self.config.heartbeat_interval_s is None and answer.get("heartbeat_interval_s"):
                self.heartbeat_interval_s = max(
                    MIN_INTERVAL_S, float(answer["heartbeat_interval_s"])
                )
            if self.config.poll_interval_s is None and answer.get("poll_interval_s"):
                self.poll_interval_s = max(MIN_INTERVAL_S, float(answer["poll_interval_s"]))
            log.info(
                "registered as node %s (heartbeat every %gs, assignments every %gs)",
                self.node,
                self.heartbeat_interval_s,
                self.poll_interval_s,
            )
            self.connected = True
            self._reconcile = True
            self._version = None
            return True
        return False

    def shutdown(self) -> None:
        """Stop all work (SIGTERM, grace, SIGKILL), report the exits if the portal answers."""
        runner = self.runner
        stopping = runner.stop_all("killed", "the node agent is shutting down")
        if stopping:
            log.info("stopping %d attempt(s) before exiting", stopping)
        longest = max((j.grace_s for j in runner.alive_jobs()), default=0.0)
        # Heartbeats go on while the work stops (a long grace must not make the node look lost).
        if not runner.wait_all(longest + LEFTOVER_GRACE_S + READER_DRAIN_S + 2.0):
            for job in runner.alive_jobs():  # the last resort; nothing may outlive the agent
                runner.kill_now(job)
            runner.wait_all(2.0)
        self.publish()
        stopped = self.stop_beats()
        if self.node is not None and runner.outbox:
            try:
                self._flush_outbox(
                    attempts=SHUTDOWN_REPORT_ATTEMPTS, stop=threading.Event(), apply=False
                )
                if stopped:  # the last heartbeat says nothing runs any more
                    self.publish()
                    self._heartbeat(attempts=SHUTDOWN_REPORT_ATTEMPTS, stop=threading.Event())
            except PortalError as exc:
                log.warning(
                    "could not tell the portal about %d exit(s) before exiting: %s",
                    sum(1 for m in runner.outbox if m.kind == "exited"),
                    exc,
                )
        if stopped:  # else the heartbeat thread may still be using them
            self.backend.close()
            self.beat_client.close()
        self.client.close()
        log.info("agent stopped")

    def stop_beats(self) -> bool:
        """Stop the heartbeat thread: its retries end at once, a request in flight within the
        request timeout. Whether it ended (False: it is stuck, and is left as a daemon)."""
        self._beat_stop.set()
        thread = self._beat_thread
        if thread is None:
            return True
        thread.join(self.config.request_timeout_s + 2.0)
        if thread.is_alive():
            log.warning("the heartbeat thread did not stop within the request timeout")
            return False
        return True

    # -- the heartbeat thread -----------------------------------------------------------------

    def publish(self) -> None:
        """Publish what the runner runs for the heartbeat thread (main thread only)."""
        runner = self.runner
        self._view = RunnerView(
            running=runner.running(),
            busy_gpus=frozenset(runner.busy_gpus()),
            processes_by_gpu=runner.processes_by_gpu(),
        )

    def beat_loop(self) -> None:
        """Sample the GPUs at 1 Hz and heartbeat every interval, until `stop_beats`; failures
        back off (with jitter, so a fleet does not come back in step) but never past what the
        portal's loss limit allows for, and never wait on the main thread."""
        stop = self._beat_stop
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        next_sample = next_beat = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_sample:
                self._sample()
                next_sample = now + SAMPLE_INTERVAL_S
            if now >= next_beat:
                try:
                    self._heartbeat(attempts=self.config.request_attempts, stop=stop)
                except Unauthorized as exc:
                    log.error("heartbeat: the portal rejected this node's token (%s)", exc)
                    next_beat = now + self.config.unauthorized_backoff_s
                except PortalError as exc:
                    if not stop.is_set():
                        log.warning("heartbeat failed (%s); the next one as scheduled", exc)
                    next_beat = now + max(self.heartbeat_interval_s, backoff.next())
                except Exception:  # a bug here must not end the node's liveness
                    log.exception("unexpected error sending a heartbeat; carrying on")
                    next_beat = now + self.heartbeat_interval_s
                else:
                    backoff.reset()
                    next_beat = now + self.heartbeat_interval_s
            stop.wait(max(0.005, min(next_sample, next_beat) - time.monotonic()))

    def _take_beat_news(self) -> None:
        """Act, in the main thread, on what the last heartbeats answered."""
        with self._news_lock:
            news, self._beat_news = self._beat_news, {}
        if "fenced" in news:
            self._set_fenced(news["fenced"])
        if "images" in news:  # the curated images this node keeps pulled
            self.runner.runtime.keep_pulled(news["images"])
        if news.get("deleted_volumes"):  # node-local volumes deleted in the portal
            self.runner.remove_volumes(news["deleted_volumes"])

    # -- the loop ------------------------------------------------------------------------------

    def pause(self) -> float:
        """How long to wait before the next round: a tick at most, less when the next poll
        falls due sooner, so it keeps its interval instead of being rounded up to whole ticks
        (a 0.5 s poll on 0.2 s ticks would be 0.6 s). Never before the next contact a backoff
        allows. (Heartbeats have their own thread and schedule.)"""
        due = self._next_contact if self._poll_due else max(self._next_poll, self._next_contact)
        return min(self.config.tick_s, max(0.005, due - time.monotonic()))

    def _assignments_changed(self) -> None:
        """The watch heard that this node's assignments changed (any thread): poll now."""
        self._poll_due = True
        self._wake.set()

    def _poll_interval(self) -> float:
        """The poll interval now: the usual one, or the slow fallback while the watch is live."""
        if self.watch is not None and self.watch.live.is_set():
            return max(self.poll_interval_s, self.config.watch_poll_interval_s)
        return self.poll_interval_s

    def tick(self) -> None:
        """One round: reap and ship, then whatever contact with the portal is due."""
        self.runner.poll()
        self._take_beat_news()
        self.publish()
        now = time.monotonic()
        if now < self._next_contact:
            return
        attempts = self.config.request_attempts
        try:
            # While reconciling, what runs is reported (a heartbeat, from this thread on the
            # heartbeat's connection) before anything is applied.
            self._flush_outbox(attempts=attempts, apply=not self._reconcile)
            if self._reconcile:
                self.publish()
                self._heartbeat(attempts=attempts)
                self._take_beat_news()
            if self._reconcile or self._poll_due or time.monotonic() >= self._next_poll:
                self._poll_due = False  # a wake-up during the poll makes another one
                self._poll_assignments(attempts=attempts)
                self.runner.poll()
                self.publish()
                self._flush_outbox(attempts=attempts)  # "started" right after the start
                self.publish()
        except Unauthorized as exc:
            log.error(
                "the portal rejected this node's token (%s): check NODE_TOKEN; work keeps "
                "running; retrying in %.0fs",
                exc,
                self.config.unauthorized_backoff_s,
            )
            self._lost_contact(str(exc), self.config.unauthorized_backoff_s)
            return
        except PortalError as exc:  # unreachable, 5xx, or an answer that is not our JSON
            self._lost_contact(str(exc), self._backoff.next())
            return
        if not self.connected:
            log.warning("back in contact with the portal; reconciled")
        self.connected = True
        self._reconcile = False
        self._backoff.reset()

    def _lost_contact(self, why: str, delay: float) -> None:
        if self.connected:
            log.warning("lost contact with the portal (%s); work keeps running", why)
        self.connected = False
        self._reconcile = True  # on reconnect: report what runs, then apply assignments
        self._version = None  # and read them in full
        self._next_contact = time.monotonic() + delay

    def _sample(self) -> None:
        """Buffer one telemetry record per GPU, stamped with when it was taken (any thread)."""
        view = self._view
        with self._sample_lock:
            try:
                samples = self.backend.sample(set(view.busy_gpus), view.processes_by_gpu)
            except Exception:  # a telemetry glitch must never stop the heartbeat
                log.exception("GPU telemetry failed; heartbeat without it")
                return
            self._buffer.append((time.monotonic(), samples))
            del self._buffer[:-MAX_BUFFERED_INSTANTS]

    def _instants_that_fit(self) -> list[tuple[float, list[dict[str, Any]]]]:
        """The newest buffered instants whose samples fit in one heartbeat (the protocol's
        MAX_HEARTBEAT_SAMPLES); older ones are dropped from the buffer, never sent."""
        fit, count = 0, 0
        for _, samples in reversed(self._buffer):
            if count + len(samples) > MAX_HEARTBEAT_SAMPLES:
                break
            count += len(samples)
            fit += 1
        del self._buffer[: len(self._buffer) - fit]
        return [
            (
                taken,
                [
                    {**s, "processes": s["processes"][:MAX_SAMPLE_PROCESSES]}
                    if s.get("processes")
                    else s
                    for s in samples
                ],
            )
            for taken, samples in self._buffer
        ]

    def _heartbeat(self, *, attempts: int | None, stop: threading.Event | None = None) -> None:
        """One heartbeat on the heartbeat's own client (either thread; one at a time). What
        the answer asks of the runner is left for the main thread (`_take_beat_news`)."""
        with self._beat_lock:
            self._send_heartbeat(attempts=attempts, stop=stop)

    def _send_heartbeat(self, *, attempts: int | None, stop: threading.Event | None) -> None:
        with self._sample_lock:
            stale = not self._buffer or time.monotonic() - self._buffer[-1][0] >= (
                SAMPLE_INTERVAL_S / 2
            )
        if stale:
            self._sample()  # the newest instant is taken now
        with self._sample_lock:
            sent, sent_at = self._instants_that_fit(), time.monotonic()
        body = {
            # every buffered instant, oldest first; `age_s` (not a clock time) places each sample
            "telemetry": [
                {**{k: s.get(k) for k in TELEMETRY_KEYS}, "age_s": round(sent_at - taken, 3)}
                for taken, samples in sent
                for s in samples
            ],
            "running": self._view.running,
        }
        try:
            answer = self.beat_client.heartbeat(body, attempts=attempts, stop=stop)
        except Conflict:
            self._tell_main(fenced=True)
            return
        except RequestRejected as exc:
            log.error("heartbeat refused: %s", exc)
            with self._sample_lock:
                self._buffer.clear()  # the portal will not take them: do not resend
            return
        self.beats_answered += 1
        if sent:  # off the buffer: what was sent (and anything older, dropped meanwhile)
            last = sent[-1][0]
            with self._sample_lock:
                self._buffer = [entry for entry in self._buffer if entry[0] > last]
        news: dict[str, Any] = {"fenced": bool(answer.get("fenced"))}
        images = answer.get("images")
        if isinstance(images, list):
            news["images"] = [i for i in images if isinstance(i, str)]
        deleted = answer.get("deleted_volumes")
        if isinstance(deleted, list):
            news["deleted_volumes"] = [
                v for v in deleted if isinstance(v, int) and not isinstance(v, bool) and v > 0
            ]
        self._tell_main(**news)

    def _tell_main(self, **news: Any) -> None:
        with self._news_lock:
            self._beat_news.update(news)

    def _poll_assignments(self, *, attempts: int | None) -> None:
        """Read the assignments (with any started/exited reports on the way) and apply them."""
        self._next_poll = time.monotonic() + self._poll_interval()
        if self._sync_supported:
            self._sync(attempts=attempts, apply=True)
            if self._sync_supported:
                return
        try:
            answer = self.client.assignments(attempts=attempts)
        except Conflict:
            self._set_fenced(True)
            return
        except RequestRejected as exc:
            log.error("assignments refused: %s", exc)
            return
        self._take_assignments(answer)

    def _sync(
        self, *, attempts: int | None, apply: bool, stop: threading.Event | None = None
    ) -> None:
        """POST /sync: the outbox's leading started/exited reports, then the assignments.

        The portal answers each report (a conflict: that attempt is stale, forget it) and the
        assignments, or only `unchanged` when they are still those of `version`. With `apply`
        false (reconciling, shutting down) the assignments answered are not acted on.
        """
        runner = self.runner
        batch: list[Message] = []
        for message in runner.outbox:
            if message.kind not in SYNC_KINDS or len(batch) >= SYNC_BATCH:
                break
            batch.append(message)
        body = {
            "version": self._version if apply else None,
            "reports": [{"kind": m.kind, "job_id": m.job_id, **m.body} for m in batch],
            "assignments": apply,
        }
        try:
            answer = self.client.sync(body, attempts=attempts, stop=stop)
        except Conflict:
            self._set_fenced(True)
            return
        except RequestRejected as exc:
            if exc.status in (404, 405):
                log.warning("the portal has no /sync: one request per report and poll")
                self._sync_supported = False
                return
            log.error("dropping %d report(s) the portal refused: %s", len(batch), exc)
            answer = {"unchanged": True, "results": []}
        for message in batch:  # sent and answered: off the outbox, in order
            if runner.outbox and runner.outbox[0] is message:
                runner.outbox.popleft()
        results = answer.get("results")
        answered = results if isinstance(results, list) else []
        for message, result in zip(batch, answered, strict=False):  # a short answer: none
            if isinstance(result, dict) and result.get("conflict"):
                runner.forget(message.key, f"the portal answered conflict ({result['conflict']})")
        if not apply:
            return
        self._next_poll = time.monotonic() + self._poll_interval()
        if answer.get("unchanged"):
            if not self.fenced:  # deferred starts (an old attempt still stopping) go ahead now
                self.apply(self._assignments, keep=self._unreadable)
            return
        self._take_assignments(answer)
        version = answer.get("version")
        self._version = version if isinstance(version, str) and not self.fenced else None

    def _take_assignments(self, answer: dict[str, Any]) -> None:
        self._set_fenced(bool(answer.get("fenced")))
        if self.fenced:
            self._assignments, self._unreadable = [], set()
            return
        assignments = []
        unreadable: set[tuple[int, int]] = set()
        for raw in answer.get("assignments") or []:
            try:
                assignments.append(
                    Assignment.from_dict(raw, default_grace_s=self.config.default_grace_s)
                )
            except AssignmentError as exc:
                log.error("ignoring an assignment: %s", exc)
                # Still listed, so not to be stopped for want of a field.
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    unreadable.add((int(raw["job_id"]), int(raw["attempt"])))
        self._assignments, self._unreadable = assignments, unreadable
        self.apply(assignments, keep=unreadable)

    def _set_fenced(self, fenced: bool) -> None:
        if fenced and not self.fenced:
            log.warning("the portal fenced this node: stopping all work, starting nothing")
        elif not fenced and self.fenced:
            log.warning("the portal lifted the fence on this node")
        self.fenced = fenced
        if fenced:
            self._fence_draining = True
            self.runner.stop_all("killed", "the portal fenced this node")

    def apply(
        self, assignments: Sequence[Assignment], *, keep: Set[tuple[int, int]] = frozenset()
    ) -> None:
        """Make the node run exactly the attempts the portal assigns to it (and `keep`)."""
        runner = self.runner
        by_key = {a.key: a for a in assignments}
        for job in runner.alive_jobs():
            a = by_key.get(job.key)
            if a is None and job.key in keep:
                continue
            if a is None:
                runner.stop(job.key, "killed", "no longer assigned to this node")
            elif a.action == "stop":
                runner.stop(
                    job.key,
                    stop_reason_to_exit_reason(a.stop_reason),
                    f"stop requested by the portal ({a.stop_reason or 'no reason given'})",
                    grace_s=a.grace_seconds,
                    request=a.stop_reason,
                )
        if self._fence_draining:
            if runner.jobs or runner.outbox:
                return  # every exit of the fenced era is reported before anything new starts
            self._fence_draining = False
        for a in assignments:
            if a.action != "run" or runner.knows(a.key):
                continue
            older = [j for j in runner.alive_jobs() if j.job_id == a.job_id]
            if older:  # a new attempt replaces an old one only once the old one is gone
                for j in older:
                    runner.stop(j.key, "killed", f"superseded by attempt {a.attempt}")
                continue
            foreign = [u for u in a.gpu_uuids if u not in self._gpu_uuids]
            if foreign:
                runner.reject(a, f"GPU(s) not on this node: {', '.join(foreign)}")
                continue
            runner.start(a)
        # stopped jobs' workspaces stay only while the job is still assigned here
        runner.release_workspaces({a.job_id for a in assignments} | {k[0] for k in keep})

    def _flush_outbox(
        self, *, attempts: int | None, stop: threading.Event | None = None, apply: bool = True
    ) -> None:
        """Send started/logs/exited reports in order; 409 forgets the attempt.

        Runs of started/exited reports go in one /sync round trip each (which also refreshes
        the assignments when `apply`); log chunks one request each.
        """
        runner = self.runner
        while runner.outbox:
            message = runner.outbox[0]
            if self._sync_supported and message.kind in SYNC_KINDS:
                self._sync(attempts=attempts, apply=apply, stop=stop)
                if self._sync_supported and runner.outbox and runner.outbox[0] is message:
                    return  # not taken (a fenced answer): the next round sends it again
                if self._sync_supported:
                    continue
            try:
                self.client.request(
                    "POST", message.path, message.body, attempts=attempts, stop=stop
                )
            except Conflict as exc:
                runner.forget(message.key, f"the portal answered 409 ({exc.detail or 'stale'})")
                continue
            except RequestRejected as exc:
                log.error("dropping a %s report the portal refused: %s", message.kind, exc)
            if runner.outbox and runner.outbox[0] is message:
                runner.outbox.popleft()


def run(config: Config, stop: threading.Event | None = None) -> int:
    """Run the agent in this process until SIGTERM/SIGINT (or `stop`); the exit status."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("%s received: stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    Agent(config).run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    config = Config.from_args(argv)
    logging.basicConfig(
        level=getattr(logging, config.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    return run(config)
