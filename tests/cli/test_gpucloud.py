"""The `gpucloud` console script against the live test server, with a real token.

Each test runs the installed console script as a subprocess (with this checkout's `cli/` first
on its path), pointed at pytest-django's live_server by `gpucloud login`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from portal.services import token_create
from scheduler.models import Job, LogChunk

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("gpucloud")

MANIFEST = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: from-yaml
  namespace: alpha
spec:
  template:
    spec:
      containers:
        - name: main
          image: pytorch/pytorch:2.4
          command: ["python", "train.py"]
          resources:
            limits:
              nvidia.com/gpu: 2
"""


class Cli:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("GPUCLOUD_URL", "GPUCLOUD_TOKEN")
        }
        self.env.update(GPUCLOUD_CONFIG=str(config), PYTHONPATH=str(REPO / "cli"))

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def json(self, *args: str) -> object:
        return json.loads(self.ok(*args, "--json"))


@pytest.fixture
def cli(tmp_path):
    if not SCRIPT.exists():
        pytest.fail(f"no gpucloud console script next to {sys.executable}: run `make venv`")
    return Cli(tmp_path / "home" / "gpucloud" / "config.json")


@pytest.fixture
def logged_in(cli, live_server, team, fleet):
    secret = token_create(user=team["member"], name="cli").secret
    cli.ok("login", "--url", live_server.url, "--token", secret)
    return cli


def test_login_stores_the_token_readable_only_by_the_user(cli, live_server, team):
    secret = token_create(user=team["member"], name="cli").secret
    out = cli.ok("login", "--url", live_server.url + "/", "--token", "-", stdin=secret + "\n")
    assert f"Logged in to {live_server.url};" in out and "Projects: alpha" in out
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    assert json.loads(cli.config.read_text()) == {"url": live_server.url, "token": secret}
    assert cli.ok("logout") == "Logged out.\n"
    assert not cli.config.exists()


def test_login_refuses_a_bad_token_and_stores_nothing(cli, live_server, team):
    result = cli("login", "--url", live_server.url, "--token", "gpc_not-a-token")
    assert result.returncode == 1
    assert result.stderr.startswith("gpucloud: The portal refused this token: ")
    assert "(HTTP 401)" in result.stderr
    assert not cli.config.exists()


def test_clear_messages_without_login_or_portal(cli, live_server):
    result = cli("ls")
    assert result.returncode == 2
    assert result.stderr == (
        "gpucloud: Not logged in. Run `gpucloud login --url https://<portal>` first.\n"
    )
    result = cli("login", "--url", "portal.example.org", "--token", "x")
    assert result.returncode == 2 and "Not a portal URL: 'portal.example.org'" in result.stderr
    result = cli("login", "--url", "http://127.0.0.1:9", "--token", "x")
    assert result.returncode == 3
    assert "Cannot reach the portal at http://127.0.0.1:9: connection refused" in result.stderr
    # A server that is not the portal: its own 404 page, not a traceback.
    result = cli("login", "--url", f"{live_server.url}/static", "--token", "x")
    assert result.returncode == 1 and "HTTP 404" in result.stderr
    assert "Traceback" not in result.stderr


def test_submit_ls_status_cancel(logged_in, team):
    out = logged_in.ok(
        "submit", "--project", "alpha", "--name", "train", "--gpus", "2",
        "--gpu-model", "H100-80GB-SXM", "--env", "LR=3e-4", "--runtime-estimate", "2h", "--time-limit", "1d",
        "--", "python", "train.py", "--epochs", "3",
    )  # fmt: skip
    job = Job.objects.get()
    assert job.command == "python train.py --epochs 3"
    assert job.gpus == 2 and job.env == {"LR": "3e-4"}
    assert (job.runtime_estimate_s, job.time_limit_s) == (7200, 86400)
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "PROJECT", "STATE", "GPUS"]
    assert row.split()[:3] == [str(job.pk), "train", "alpha"]

    listing = logged_in.ok("ls").splitlines()
    assert listing[0].split()[:4] == ["ID", "NAME", "PROJECT", "STATE"]
    assert listing[1].split()[:3] == [str(job.pk), "train", "alpha"]
    # Columns are aligned: every row's NAME starts where the header's does.
    assert listing[1].index("train") == listing[0].index("NAME")
    assert [j["id"] for j in logged_in.json("ls")] == [job.pk]  # type: ignore[union-attr]

    status = logged_in.ok("status", str(job.pk))
    job.refresh_from_db()
    assert f"State:            {job.state}" in status
    assert "Cost so far:      0.00 USD" in status
    if job.state == "queued":
        assert "Queue position:" in status and "Waiting for:" in status
    detail = logged_in.json("status", str(job.pk))
    assert detail["id"] == job.pk and detail["billing"]["cost"] == "0.00"  # type: ignore[index]

    assert logged_in.ok("cancel", str(job.pk)) == f"Job {job.pk} (train) is cancelled.\n"
    again = logged_in("cancel", str(job.pk))
    assert again.returncode == 1
    assert again.stderr == f"gpucloud: Job {job.pk} already ended (cancelled). (HTTP 400)\n"


def test_api_errors_exit_non_zero_with_the_apis_message(logged_in):
    result = logged_in(
        "submit", "--project", "alpha", "--name", "x", "--gpu-model", "H999", "--command", "true"
    )
    assert result.returncode == 1
    assert result.stderr == (
        "gpucloud: gpu_model: Unknown GPU model 'H999'. GET /api/v1/gpu-models lists them."
        " (HTTP 400)\n"
    )
    result = logged_in("submit", "--project", "alpha", "--gpus", "0", "--command", "true")
    assert result.returncode == 1
    assert "\n  name: This field is required.\n" in result.stderr
    assert "\n  gpus: Ensure this value is greater than or equal to 1.\n" in result.stderr
    result = logged_in("status", "999999")
    assert (result.returncode, result.stderr) == (1, "gpucloud: Not found. (HTTP 404)\n")
    assert logged_in("status", "abc").returncode == 2  # argparse: a job id is a number
    assert Job.objects.count() == 0


def test_submit_a_kubernetes_manifest(logged_in, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST)
    data = logged_in.json("submit", "-f", str(path))
    job = Job.objects.get()
    assert data["id"] == job.pk and job.name == "from-yaml"  # type: ignore[index]
    assert job.gpus == 2 and job.image == "pytorch/pytorch:2.4"
    result = logged_in("submit", "-f", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "Cannot read" in result.stderr


def test_a_retried_submit_with_its_key_creates_one_job(logged_in):
    args = ["submit", "--project", "alpha", "--name", "r", "--command", "true"]
    first = logged_in.json(*args, "--idempotency-key", "retry-1")
    second = logged_in.json(*args, "--idempotency-key", "retry-1")
    assert first == second and Job.objects.count() == 1


def test_dry_run_says_what_would_happen_and_creates_nothing(logged_in):
    out = logged_in.ok(
        "dry-run", "--project", "alpha", "--name", "d", "--gpus", "1",
        "--gpu-model", "H100-80GB-SXM", "--runtime-estimate", "1h", "--command", "true",
    )  # fmt: skip
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert lines["Admitted"].strip().startswith("yes")
    assert lines["Starts now"].strip() in ("yes", "no")
    assert lines["Cost per hour"].strip() not in ("", "-")
    answer = logged_in.json("dry-run", "--project", "alpha", "--name", "d", "--command", "true")
    assert answer["admitted"] is True  # type: ignore[index]
    assert Job.objects.count() == 0


def test_logs_and_follow_until_the_job_ends(logged_in, team):
    from scheduler.admission import job_cancel

    job_id = logged_in.json("submit", "--project", "alpha", "--name", "l", "--command", "true")
    job = Job.objects.get(pk=job_id["id"])  # type: ignore[index]
    LogChunk.objects.create(job=job, attempt=1, seq=0, text="epoch 1\n")
    assert logged_in.ok("logs", str(job.pk)) == "epoch 1\n"

    follow = subprocess.Popen(
        [str(SCRIPT), "logs", str(job.pk), "-f", "--interval", "0.2"],
        env=logged_in.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    assert follow.stdout.readline() == "epoch 1\n"  # it printed what there was, and waits
    LogChunk.objects.create(job=job, attempt=1, seq=1, text="epoch 2\n")
    assert follow.stdout.readline() == "epoch 2\n"
    job_cancel(actor=team["member"], job=job)
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0 and out == ""
    assert err == f"[job {job.pk} cancelled]\n"


def test_usage(logged_in):
    out = logged_in.ok("usage")  # the member's only project
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    assert lines["Project"].strip() == "alpha" and lines["To date"].strip() == "0.00"
    usage = logged_in.json("usage", "--project", "alpha")
    assert usage["to_date"] == "0.00"  # type: ignore[index]
    result = logged_in("usage", "--project", "beta")
    assert result.returncode == 1 and "(HTTP 404)" in result.stderr


class _LossyGateway(BaseHTTPRequestHandler):
    """Forwards to the portal; the first POST's answer is lost on the way back (a 502)."""

    portal = ""
    lost = 0
    keys: list[str] = []

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
        if self.command == "POST":
            type(self).keys.append(self.headers.get("Idempotency-Key", ""))
        answer = requests.request(
            self.command, self.portal + self.path, data=body, headers=headers, timeout=60
        )
        if self.command == "POST" and type(self).lost == 0:
            type(self).lost += 1
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, *args: object) -> None:
        pass


def test_a_lost_answer_is_retried_with_the_same_key_and_runs_once(cli, live_server, team, fleet):
    """The portal ran the submit, but the gateway lost its answer: the CLI's retry carries the
    same Idempotency-Key, so it gets the first answer and no second job exists."""
    _LossyGateway.portal, _LossyGateway.lost, _LossyGateway.keys = live_server.url, 0, []
    gateway = ThreadingHTTPServer(("127.0.0.1", 0), _LossyGateway)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        secret = token_create(user=team["member"], name="cli").secret
        cli.ok("login", "--url", url, "--token", secret)
        job = cli.json("submit", "--project", "alpha", "--name", "once", "--command", "true")
    finally:
        gateway.shutdown()
    assert _LossyGateway.lost == 1
    assert len(_LossyGateway.keys) == 2 and len(set(_LossyGateway.keys)) == 1
    assert [j.pk for j in Job.objects.all()] == [job["id"]]  # type: ignore[index]


def test_submit_with_dependencies_in_slurms_syntax(logged_in):
    shards = logged_in.json(
        "submit",
        "--project",
        "alpha",
        "--name",
        "render",
        "--shard-count",
        "2",
        "--command",
        "true",
    )
    root = shards[0]["id"]  # type: ignore[index]
    single = logged_in.json("submit", "--project", "alpha", "--name", "x", "--command", "true")
    merge = logged_in.json(
        "submit", "--project", "alpha", "--name", "merge", "--command", "true",
        "--dependency", f"afterok:{root}", "--dependency", f"afterany:{single['id']}",  # type: ignore[index]
    )  # fmt: skip
    job = Job.objects.get(pk=merge["id"])  # type: ignore[index]
    deps = sorted(job.dependencies.values_list("kind", "on_id", "whole_array"))
    assert deps == [("after_any", single["id"], False), ("after_ok", root, True)]  # type: ignore[index]
    assert job.waiting_on_dependencies
    bad = logged_in("submit", "--project", "alpha", "--name", "m", "--command", "true",
                    "--dependency", "afterok=3")  # fmt: skip
    assert bad.returncode == 2 and "expected e.g. afterok:12" in bad.stderr


def test_logs_say_when_output_passed_the_log_quota(logged_in):
    job_id = logged_in.json("submit", "--project", "alpha", "--name", "q", "--command", "true")
    job = Job.objects.get(pk=job_id["id"])  # type: ignore[index]
    LogChunk.objects.create(job=job, attempt=1, seq=0, text="kept\n")
    Job.objects.filter(pk=job.pk).update(log_quota_hit=1024 * 1024)
    result = logged_in("logs", str(job.pk))
    assert result.returncode == 0 and result.stdout == "kept\n"
    assert "[log truncated: this job's output reached its log quota of 1 MiB" in result.stderr


def test_submit_mounts_volumes_and_checkpoints_to_one(logged_in, team):
    from storage.models import FillState, Volume

    Volume.objects.create(project=team["a"], name="ckpt", kind="shared", size_gib=1)
    Volume.objects.create(
        project=team["a"], name="ds", kind="shared", size_gib=1, is_dataset=True,
        fill_state=FillState.READY,
    )  # fmt: skip
    logged_in.ok(
        "submit", "--project", "alpha", "--name", "v", "--volume", "ds:/in:ro",
        "--volume", "tmp:/scratch:scratch=3", "--checkpoint", "ckpt:runs/v",
        "--working-dir", "/data/ckpt", "--", "python", "train.py",
    )  # fmt: skip
    job = Job.objects.get()
    assert job.volumes == [
        {"name": "ds", "path": "/in", "read_only": True},
        {"name": "tmp", "path": "/scratch", "read_only": False, "kind": "scratch", "size_gib": 3},
        {"name": "ckpt", "path": "/data/ckpt", "read_only": False},
    ]
    assert (job.checkpoint, job.working_dir) == ("ckpt:runs/v", "/data/ckpt")
    refused = logged_in("submit", "--project", "alpha", "--name", "h", "--working-dir", "/root",
                        "--", "true")  # fmt: skip
    assert refused.returncode == 1 and "working_dir" in refused.stderr, refused.stderr
    bad = logged_in("submit", "--project", "alpha", "--volume", "ds:data", "--", "true")
    assert bad.returncode == 2 and "NAME:/path" in bad.stderr
