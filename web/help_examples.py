"""The help page's API examples, written once: the page shows this text and
`tests/web/test_help.py` runs it (curl and the CLI through bash, Python through the
interpreter) against the live test server. Each reads the portal's address, an API token and
a project from `$GPUCLOUD_URL`, `$GPUCLOUD_TOKEN` and `$GPUCLOUD_PROJECT`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    key: str
    title: str
    what: str
    curl: str
    python: str
    cli: str
    # What every variant's output contains when it worked (the test checks it).
    expect: str

    @property
    def variants(self) -> list[tuple[str, str]]:
        return [("curl", self.curl), ("Python", self.python), ("CLI", self.cli)]


SETUP = """\
export GPUCLOUD_URL=https://portal.example.org     # this portal's address
export GPUCLOUD_TOKEN=gpc_...                      # from API tokens (scope: submit)
export GPUCLOUD_PROJECT=my-project                 # a project you are a member of"""

EXAMPLES: tuple[Example, ...] = (
    Example(
        key="dry-run",
        title="Price a job before you submit it",
        what="A dry run: would it be admitted, what does it cost per hour, when would it start "
        "and, if it would wait, why. Nothing is created.",
        curl="""\
curl -sS -X POST "$GPUCLOUD_URL/api/v1/jobs/dry-run" \\
  -H "Authorization: Bearer $GPUCLOUD_TOKEN" -H "Content-Type: application/json" \\
  -d '{"project": "'"$GPUCLOUD_PROJECT"'", "name": "try", "command": "python train.py", "gpus": 1}'""",
        python="""\
import os, requests

url, token = os.environ["GPUCLOUD_URL"], os.environ["GPUCLOUD_TOKEN"]
answer = requests.post(
    f"{url}/api/v1/jobs/dry-run",
    headers={"Authorization": f"Bearer {token}"},
    json={"project": os.environ["GPUCLOUD_PROJECT"], "name": "try",
          "command": "python train.py", "gpus": 1},
    timeout=30,
)
answer.raise_for_status()
dry = answer.json()
print("admitted:", dry["admitted"], "cost_per_hour:", dry["cost_per_hour"])""",
        cli="""\
gpucloud dry-run --project "$GPUCLOUD_PROJECT" --name try --gpus 1 -- python train.py""",
        expect="admitted",
    ),
    Example(
        key="submit",
        title="Submit a job",
        what="One GPU, preemptible (cheaper; may be paused and resumed from its checkpoint, "
        "kept at runs/train in the project's volume ckpt: create it once with "
        "gpucloud volume create ckpt --size 10). The answer is 201 with the job; send an "
        "Idempotency-Key to retry safely.",
        curl="""\
curl -sS -X POST "$GPUCLOUD_URL/api/v1/jobs" \\
  -H "Authorization: Bearer $GPUCLOUD_TOKEN" -H "Content-Type: application/json" \\
  -H "Idempotency-Key: $(uuidgen 2>/dev/null || date +%s%N)" \\
  -d '{"project": "'"$GPUCLOUD_PROJECT"'", "name": "train", "command": "python train.py",
       "gpus": 1, "preemptible": true, "checkpoint": "ckpt:runs/train"}'""",
        python="""\
import os, uuid, requests

url, token = os.environ["GPUCLOUD_URL"], os.environ["GPUCLOUD_TOKEN"]
answer = requests.post(
    f"{url}/api/v1/jobs",
    headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())},
    json={"project": os.environ["GPUCLOUD_PROJECT"], "name": "train",
          "command": "python train.py", "gpus": 1, "preemptible": True,
          "checkpoint": "ckpt:runs/train"},
    timeout=30,
)
answer.raise_for_status()
job = answer.json()
print("submitted job", job["id"], job["name"], "state:", job["state"])""",
        cli="""\
gpucloud submit --project "$GPUCLOUD_PROJECT" --name train --gpus 1 --preemptible \\
  --checkpoint ckpt:runs/train -- python train.py""",
        expect="train",
    ),
    Example(
        key="waiting",
        title="See why your jobs wait",
        what="Queued jobs carry their pending reason, their place in the queue and an "
        "estimated start.",
        curl="""\
curl -sS "$GPUCLOUD_URL/api/v1/jobs?state=queued,running&project=$GPUCLOUD_PROJECT" \\
  -H "Authorization: Bearer $GPUCLOUD_TOKEN\"""",
        python="""\
import os, requests

url, token = os.environ["GPUCLOUD_URL"], os.environ["GPUCLOUD_TOKEN"]
answer = requests.get(
    f"{url}/api/v1/jobs",
    headers={"Authorization": f"Bearer {token}"},
    params={"state": "queued,running", "project": os.environ["GPUCLOUD_PROJECT"]},
    timeout=30,
)
answer.raise_for_status()
for job in answer.json()["results"]:
    print(job["id"], job["name"], job["state"], (job["pending"] or {}).get("reason", ""))""",
        cli="""\
gpucloud ls --state queued,running --project "$GPUCLOUD_PROJECT\"""",
        expect="train",
    ),
    Example(
        key="usage",
        title="What your project used this month",
        what="GPU-hours and cost so far this month, against the budget.",
        curl="""\
curl -sS "$GPUCLOUD_URL/api/v1/billing/projects/$GPUCLOUD_PROJECT/usage" \\
  -H "Authorization: Bearer $GPUCLOUD_TOKEN\"""",
        python="""\
import os, requests

url, token = os.environ["GPUCLOUD_URL"], os.environ["GPUCLOUD_TOKEN"]
project = os.environ["GPUCLOUD_PROJECT"]
answer = requests.get(
    f"{url}/api/v1/billing/projects/{project}/usage",
    headers={"Authorization": f"Bearer {token}"},
    timeout=30,
)
answer.raise_for_status()
print(project, "usage:", answer.json())""",
        cli="""\
gpucloud usage --project "$GPUCLOUD_PROJECT\"""",
        expect="forecast",
    ),
)
