"""Services enqueue tasks by name; a fresh process (a web worker) has imported no tasks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh Python process (a web worker before any request), test settings."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


PROBE = """
import django
django.setup()
from celery import current_app
assert "scheduler.cycle" not in current_app.tasks, "imported already: the probe proves nothing"
from foundation.enqueue import task_named
print(task_named("scheduler.cycle").name, task_named("billing.send_invoice_email").name)
"""


def test_a_fresh_process_finds_tasks_by_name():
    result = run_fresh(PROBE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["scheduler.cycle", "billing.send_invoice_email"]


RACE = """
import threading
import django
django.setup()
from celery import current_app
assert "scheduler.cycle" not in current_app.tasks, "imported already: the probe proves nothing"
from foundation.enqueue import task_named
names, errors = [], []
start = threading.Barrier(8)
def ask():
    start.wait()
    try:
        names.append(task_named("scheduler.cycle").name)
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=ask) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(names), errors)
"""


def test_threads_of_a_fresh_worker_asking_at_once_all_find_the_task():
    # A web worker's threads that miss a name together: before the lock, all but the first
    # got NotRegistered while the first was still importing (a 500 on submit under load).
    result = run_fresh(RACE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "8 []"


SAME_TASKS = """
import django
django.setup()
from celery import current_app
import celery.fixups.django as fixup
from foundation.enqueue import tasks_import

def checks_ran(self):
    raise SystemExit("Django's system checks ran")

fixup.DjangoWorkerFixup.validate_models = checks_ran
tasks_import()
ours = sorted(name for name in current_app.tasks if not name.startswith("celery."))
fixup.DjangoWorkerFixup.validate_models = lambda self: None
current_app.loader.import_default_modules()  # what a worker imports at start
theirs = sorted(name for name in current_app.tasks if not name.startswith("celery."))
print(ours == theirs, len(ours), "scheduler.job_notices" in ours)
"""


def test_tasks_import_registers_what_a_worker_does_without_running_the_system_checks():
    result = run_fresh(SAME_TASKS)
    assert result.returncode == 0, result.stderr
    same, count, notices = result.stdout.split()
    assert (same, notices) == ("True", "True")
    assert int(count) > 10


BOOT = """
import importlib, sys
from celery import current_app
importlib.import_module(sys.argv[1])
print("scheduler.job_notices" in current_app.tasks, "scheduler.cycle" in current_app.tasks)
"""


def test_the_web_and_agent_entry_points_register_every_task_as_the_worker_boots():
    # The first request that queues a task no longer pays for importing them (or for a lost
    # race on the registry).
    for entry in ("config.wsgi", "config.wsgi_agent", "config.asgi"):
        result = run_fresh(BOOT, entry)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "True"], entry
