"""Services enqueue tasks by name; a fresh process (a web worker) has imported no tasks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import django
django.setup()
from celery import current_app
assert "scheduler.cycle" not in current_app.tasks, "imported already: the probe proves nothing"
from portal.enqueue import task_named
print(task_named("scheduler.cycle").name, task_named("billing.send_invoice_email").name)
"""


def test_a_fresh_process_finds_tasks_by_name():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["scheduler.cycle", "billing.send_invoice_email"]


RACE = """
import threading
import django
django.setup()
from celery import current_app
assert "scheduler.cycle" not in current_app.tasks, "imported already: the probe proves nothing"
from portal.enqueue import task_named
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
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    result = subprocess.run(
        [sys.executable, "-c", RACE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "8 []"
