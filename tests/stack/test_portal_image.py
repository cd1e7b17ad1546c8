"""The portal's container image (Containerfile), built by scripts/portal-image.sh and run with
Podman (runc): it starts gunicorn under the production settings as its own user, `/healthz`
answers, and `/readyz` reports the database, Redis and the broker, naming what is down."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
PODMAN = ["podman", "--runtime", "runc"]
ENGINE_SKIP = os.environ.get("RUNTIME_TEST_SKIP", "")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The first build (base, wheels, venv) takes minutes; later ones reuse var/images/ and
    # Podman's layers, and an unchanged tree reuses the image itself.
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        bool(ENGINE_SKIP) or not (shutil.which("podman") and shutil.which("runc")),
        reason=ENGINE_SKIP or "podman or runc is missing: run through scripts/test.sh",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built or found in Podman's store (its parts are cached under var/images/)."""
    env = {**os.environ, "PY": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/portal-image.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if done.returncode != 0:
        pytest.fail(f"the portal image did not build:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def redis_with_password() -> Iterator[tuple[int, str, subprocess.Popen[bytes]]]:
    """A throwaway Redis that requires a password, as production's must."""
    port, password = free_port(), uuid.uuid4().hex
    folder = tempfile.mkdtemp(prefix="portal-image-redis-")
    server = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--requirepass", password, "--save", "", "--appendonly", "no", "--dir", folder),
        ],
        stdout=subprocess.DEVNULL,
    )
    yield port, password, server
    server.terminate()
    server.wait(timeout=10)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_image_serves_health_and_readiness(
    image: str, redis_with_password: tuple[int, str, subprocess.Popen[bytes]]
) -> None:
    redis_port, password, redis_server = redis_with_password
    db = connection.settings_dict
    database_url = (
        f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )
    port, name = free_port(), f"portal-image-test-{uuid.uuid4().hex[:8]}"
    # Podman's default limits (open files, processes) can pass this host's hard limits, which
    # runc then refuses to set: ask for no more than the host allows.
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    started = subprocess.run(
        [
            *(*PODMAN, "run", "-d", "--rm", "--name", name, "--network=host"),
            *("-e", f"DJANGO_SECRET_KEY={uuid.uuid4().hex}", "-e", f"DATABASE_URL={database_url}"),
            *("-e", f"REDIS_URL=redis://:{password}@127.0.0.1:{redis_port}/0"),
            *("-e", f"WEB_BIND=127.0.0.1:{port}", "-e", "WEB_WORKERS=1", "-e", "WEB_THREADS=2"),
            *("-e", "DJANGO_ALLOWED_HOSTS=127.0.0.1", f"--ulimit=nofile={nofile}:{nofile}"),
            *(f"--ulimit=nproc={nproc}:{nproc}", image),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}"

    def answers(path: str) -> requests.Response | None:
        try:
            return requests.get(url + path, timeout=5)
        except requests.RequestException:
            return None

    try:
        healthz = wait_for(lambda: answers("/healthz"), timeout=90)
        assert healthz.status_code == 200 and healthz.json() == {"status": "ok"}

        ready = answers("/readyz")
        assert ready is not None and ready.status_code == 200, ready and ready.text
        checks = ready.json()["checks"]
        assert {k: v["ok"] for k, v in checks.items()} == {
            "database": True,
            "cache": True,
            "broker": True,
        }
        # It runs as its own unprivileged user, with production's settings.
        who = subprocess.run(
            [*PODMAN, "exec", name, "sh", "-c", "id -u; echo $DJANGO_SETTINGS_MODULE"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert who.stdout.split() == ["10001", "config.settings.production"], who.stderr

        # Redis gone: still alive, no longer ready, and the answer names what is down.
        redis_server.terminate()
        redis_server.wait(timeout=10)
        down = answers("/readyz")
        assert down is not None and down.status_code == 503
        body = down.json()
        assert body["status"] == "not ready"
        assert body["checks"]["database"]["ok"] is True
        assert body["checks"]["cache"]["ok"] is False and body["checks"]["cache"]["error"]
        healthz = answers("/healthz")
        assert healthz is not None and healthz.status_code == 200
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "2", name], capture_output=True, timeout=60)
