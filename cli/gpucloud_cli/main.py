"""`gpucloud`: log in, submit, list, inspect, follow and cancel jobs, dry-run, usage, volumes.

Exit status: 0 done; 1 the API refused (its message is printed); 2 bad usage or not logged in;
3 the portal cannot be reached; 130 interrupted.
"""

from __future__ import annotations

import argparse
import getpass
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpucloud_cli import __version__, config, output, volumes
from gpucloud_cli.client import Api, ApiError, normalize_url

ENDED = {"succeeded", "failed", "cancelled", "rejected"}


# ---- arguments -------------------------------------------------------------------------------


def _duration(text: str) -> int:
    """Seconds, or a number with s, m, h or d: 3600, 90m, 2h, 1d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    scale = units.get(text[-1:], 0)
    number = text[:-1] if scale else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (say 3600, 90m or 2h)"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError("a duration of at least one second")
    return int(value)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


_DEPENDENCY_TYPES = {
    "afterok": "after_ok",
    "after_ok": "after_ok",
    "afterany": "after_any",
    "after_any": "after_any",
}


def _dependency(text: str) -> list[dict[str, Any]]:
    """Slurm's --dependency syntax: afterok:12:13,afterany:14 (after_ok/after_any too)."""
    out: list[dict[str, Any]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, ids = item.partition(":")
        kind = _DEPENDENCY_TYPES.get(kind.lower(), "")
        numbers = ids.split(":") if ids else []
        if not kind or not numbers or not all(n.isdigit() and int(n) > 0 for n in numbers):
            raise argparse.ArgumentTypeError(
                f"expected e.g. afterok:12 or afterany:12:13, got {item!r}"
            )
        out += [{"type": kind, "job": int(n)} for n in numbers]
    return out


def _volume_mount(text: str) -> dict[str, Any]:
    """NAME[:/PATH][:ro][:scratch=GiB] → one of the API's `volumes` (the portal checks it)."""
    name, *rest = text.strip().split(":")
    out: dict[str, Any] = {"name": name}
    for part in rest:
        if part.startswith("/"):
            out["path"] = part
        elif part in ("ro", "rw"):
            out["read_only"] = part == "ro"
        elif part == "scratch" or part.startswith("scratch="):
            out["kind"] = "scratch"
            size = part.partition("=")[2]
            if size:
                if not size.isdigit():
                    raise argparse.ArgumentTypeError(
                        f"scratch=<GiB>, e.g. scratch=20, got {text!r}"
                    )
                out["size_gib"] = int(size)
        else:
            raise argparse.ArgumentTypeError(
                f"expected NAME:/path/in/container[:ro], e.g. data:/data:ro, got {text!r}"
            )
    if not name:
        raise argparse.ArgumentTypeError(f"name the volume first, got {text!r}")
    return out


# (flag, API field, argparse options) for the job fields submit and dry-run share.
JOB_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--project", "project", {"help": "project slug"}),
    ("--name", "name", {"help": "job name"}),
    ("--command", "command", {"help": "command line (or give it after --)"}),
    ("--image", "image", {"help": "container image"}),
    ("--gpus", "gpus", {"type": int, "help": "GPUs (whole devices, per node for gang jobs)"}),
    ("--gpu-milli", "gpu_milli", {"type": int, "help": "a fraction of one GPU, in 1/1000"}),
    ("--gpu-memory-mib", "gpu_memory_mib", {"type": int, "help": "GPU memory for a fraction"}),
    ("--gpu-model", "gpu_model", {"help": "GPU model name (see the catalog)"}),
    ("--min-gpu-memory-gb", "min_gpu_memory_gb", {"type": int}),
    ("--precision", "precisions", {"action": "append", "help": "needed precision (repeat)"}),
    ("--nodes", "nodes", {"type": int, "help": "nodes for a gang job"}),
    ("--gpus-per-node", "gpus_per_node", {"type": int}),
    ("--cpu-milli", "cpu_milli", {"type": int}),
    ("--memory-mib", "memory_mib", {"type": int}),
    ("--priority", "priority", {"help": "low, normal, high or urgent (up to your quota's)"}),
    ("--preemptible", "preemptible", {"action": "store_true", "default": None}),
    (
        "--runtime-estimate",
        "runtime_estimate_s",
        {"type": _duration, "help": "expected run time: seconds, or 90m, 2h"},
    ),
    (
        "--time-limit",
        "time_limit_s",
        {"type": _duration, "help": "stop the job after this long: seconds, or 90m, 2h, 3d"},
    ),
    (
        "--volume",
        "volumes",
        {
            "action": "append",
            "type": _volume_mount,
            "metavar": "NAME[:/PATH][:ro]",
            "help": "mount the project's volume NAME at PATH in the container (default "
            "/data/NAME), :ro for read-only; NAME:/PATH:scratch=GiB for a per-job scratch "
            "volume (repeat)",
        },
    ),
    (
        "--checkpoint",
        "checkpoint",
        {
            "metavar": "VOLUME:PATH",
            "help": "checkpoints go to PATH inside the project's VOLUME (CHECKPOINT_DIR points "
            "there; a restarted job resumes from it)",
        },
    ),
    (
        "--working-dir",
        "working_dir",
        {"help": "the working directory in the container (default /workspace)"},
    ),
    ("--env", "env", {"action": "append", "type": _env_pair, "metavar": "NAME=VALUE"}),
    (
        "--secret-env",
        "secret_env",
        {
            "action": "append",
            "type": _env_pair,
            "metavar": "NAME=VALUE",
            "help": "write-only: shown masked, sent only to the node that runs the job",
        },
    ),
    ("--max-restarts", "max_restarts", {"type": int}),
    ("--elastic-min", "elastic_min", {"type": int}),
    ("--elastic-max", "elastic_max", {"type": int}),
    ("--shard-count", "shard_count", {"type": int, "help": "array job: this many shards"}),
    (
        "--dependency",
        "dependencies",
        {
            "action": "append",
            "type": _dependency,
            "metavar": "afterok:ID[:ID…]",
            "help": "start after these jobs, as Slurm's -d (afterok, afterany; repeat or comma-"
            "separate); an array's id means all its shards",
        },
    ),
]


def _job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The API's job fields from the flags given; a flag not given is left to the API's default."""
    body: dict[str, Any] = {}
    for flag, field, _ in JOB_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            if field in ("env", "secret_env"):
                value = dict(value)
            elif field == "dependencies":
                value = [d for given in value for d in given]
            body[field] = value
    if args.argv:
        if "command" in body:
            raise ApiError(
                "Give the command either with --command or after --, not both.", exit_code=2
            )
        body["command"] = shlex.join(args.argv)
    return body


# ---- commands --------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    try:
        saved = config.load()
    except config.ConfigError:
        saved = None
    url = normalize_url(args.url or (saved.url if saved else "") or _ask("Portal URL: "))
    token = args.token
    if token == "-":
        token = sys.stdin.readline().strip()
    if not token:
        # There is no public endpoint that trades a password for a token (a password never
        # leaves the browser): the token is made on the portal's page and pasted here.
        if not sys.stdin.isatty():
            raise ApiError(
                f"No token given. Create one at {url}/tokens/ and pass it with --token "
                "(or --token - to read it from standard input).",
                exit_code=2,
            )
        print(f"Create an API token at {url}/tokens/ and paste it here.", file=sys.stderr)
        token = getpass.getpass("API token: ").strip()
    if not token:
        raise ApiError("No token given.", exit_code=2)
    try:
        projects = Api(url, token).get("/api/v1/projects", {"limit": 1000})
    except ApiError as exc:
        if exc.status in (401, 403):
            raise ApiError(f"The portal refused this token: {exc.message}") from exc
        raise
    path = config.save(config.Login(url=url, token=token))
    slugs = [p["slug"] for p in projects.get("results", [])]
    if args.json:
        output.emit_json({"url": url, "config": str(path), "projects": slugs})
    else:
        print(f"Logged in to {url}; token saved in {path}.")
        print(f"Projects: {', '.join(slugs) if slugs else 'none yet'}")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    gone = config.forget()
    if not args.json:
        print("Logged out." if gone else "Was not logged in.")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    api = _api(args)
    if args.file:
        if _job_body(args).keys() - {"project"}:
            raise ApiError(
                "With -f, the manifest says everything; only --project may go with it.", exit_code=2
            )
        raw = sys.stdin.buffer.read() if args.file == "-" else _read(args.file)
        params = {"project": args.project} if args.project else None
        data = api.post(
            "/api/v1/jobs/manifest", raw=raw, params=params, idempotency_key=args.idempotency_key
        )
    else:
        data = api.post("/api/v1/jobs", _job_body(args), idempotency_key=args.idempotency_key)
    jobs = data if isinstance(data, list) else [data]
    if args.json:
        output.emit_json(data)
    else:
        output.table(
            ["ID", "NAME", "PROJECT", "STATE", "GPUS"],
            [(j["id"], j["name"], j["project"], j["state"], _gpus(j)) for j in jobs],
        )
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    if args.project:
        params["project"] = args.project
    page = _api(args).get("/api/v1/jobs", params)
    jobs = page.get("results", [])
    if args.json:
        output.emit_json(jobs)
        return 0
    output.table(
        ["ID", "NAME", "PROJECT", "STATE", "GPUS", "MODEL", "SUBMITTED", "WAITING FOR"],
        [
            (
                j["id"],
                j["name"],
                j["project"],
                j["state"],
                _gpus(j),
                j.get("gpu_model"),
                output.when(j.get("created_at")),
                (j.get("pending") or {}).get("message"),
            )
            for j in jobs
        ],
    )
    if page.get("count", 0) > len(jobs):
        print(f"({len(jobs)} of {page['count']}; --limit shows more)", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    api = _api(args)
    job = api.get(f"/api/v1/jobs/{args.job}")
    spent = api.get(f"/api/v1/billing/jobs/{args.job}/cost")
    if args.json:
        output.emit_json({**job, "billing": spent})
        return 0
    pending = job.get("pending") or {}
    cost = job.get("cost") or {}
    rows: list[tuple[str, Any]] = [
        ("Job", f"{job['id']} {job['name']}"),
        ("Project", job["project"]),
        ("State", job["state"]),
        ("GPUs", f"{_gpus(job)} {job.get('gpu_model') or 'any model'}"),
        ("Priority", job.get("priority")),
        ("Preemptible", job.get("preemptible")),
        ("Submitted", output.when(job.get("created_at"))),
    ]
    if pending:
        rows += [
            ("Waiting for", f"{pending.get('message')} ({pending.get('reason')})"),
            ("Queue position", pending.get("queue_position")),
            (
                "Estimated start",
                output.when(pending.get("estimated_start"))
                if pending.get("estimated_start")
                else "unknown",
            ),
        ]
    rows += [
        ("Started", output.when(job.get("started_at"))),
        ("Finished", output.when(job.get("finished_at"))),
    ]
    if job.get("exit_code") is not None or job.get("failure_reason"):
        rows.append(("Exit", f"{job.get('exit_code')} {job.get('failure_reason') or ''}".strip()))
    if cost:
        most = cost.get("cost_per_hour_most")
        per_hour = cost["cost_per_hour"] + (f" to {most}" if most else "")
        rows.append(("Cost per hour", f"{per_hour} {spent.get('currency', '').upper()}"))
    rows.append(("Cost so far", f"{spent['cost']} {spent.get('currency', '').upper()}"))
    for place in job.get("placement") or []:
        rows.append(
            (
                "On",
                f"{place['node']} GPU {place['gpu_index']} ({place['gpu_model']}, {place['share_milli']}/{place['capacity_milli']})",
            )
        )
    output.pairs(rows)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    api = _api(args)
    after = 0
    while True:
        chunk = api.get(f"/api/v1/jobs/{args.job}/logs", {"after": after})
        if chunk.get("text"):
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
        after = chunk.get("last") or after
        if not args.follow or chunk.get("state") in ENDED:
            if chunk.get("note"):
                print(chunk["note"], file=sys.stderr)  # output past the log quota was dropped
            if args.follow:
                print(f"[job {args.job} {chunk.get('state')}]", file=sys.stderr)
            return 0
        time.sleep(args.interval)


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _api(args).post(f"/api/v1/jobs/{args.job}/cancel", idempotency_key=args.idempotency_key)
    if args.json:
        output.emit_json(job)
    else:
        print(f"Job {job['id']} ({job['name']}) is {job['state']}.")
    return 0


def cmd_dry_run(args: argparse.Namespace) -> int:
    if args.file:
        raise ApiError(
            "The API dry-runs job fields, not manifests: give the job as flags.", exit_code=2
        )
    answer = _api(args).post(
        "/api/v1/jobs/dry-run", _job_body(args), idempotency_key=args.idempotency_key
    )
    if args.json:
        output.emit_json(answer)
        return 0
    most = answer.get("cost_per_hour_most")
    per_hour = answer.get("cost_per_hour")
    rows: list[tuple[str, Any]] = [
        ("Admitted", f"{'yes' if answer['admitted'] else 'no'} ({answer['admission_reason']})"),
        ("Starts now", answer["would_start_now"]),
        (
            "Estimated start",
            output.when(answer.get("estimated_start"))
            if answer.get("estimated_start")
            else "unknown",
        ),
        ("Queue position", answer.get("queue_position")),
        (
            "Waiting for",
            f"{answer.get('wait_message')} ({answer.get('wait_reason')})"
            if answer.get("wait_reason")
            else None,
        ),
        ("Rate per GPU-hour", answer.get("rate_per_gpu_hour")),
        ("Cost per hour", f"{per_hour} to {most}" if per_hour and most else per_hour),
        ("Cost for the estimate", answer.get("cost_for_estimate")),
        ("Borrows quota", answer.get("borrowed")),
    ]
    rows += [("Quota note", note) for note in answer.get("quota_notes") or []]
    output.pairs(rows)
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    api = _api(args)
    project = args.project or _only_project(api)
    params = {"month": args.month} if args.month else None
    usage = api.get(f"/api/v1/billing/projects/{project}/usage", params)
    if args.json:
        output.emit_json(usage)
        return 0
    budget = usage.get("budget") or {}
    output.pairs(
        [
            ("Project", project),
            ("Month", usage["month"][:7]),
            ("Metered", usage["metered"]),
            ("Not yet metered", usage["open_estimate"]),
            ("Credited", usage["credited"]),
            ("To date", usage["to_date"]),
            ("Burn per hour", usage["burn_per_hour"]),
            ("Forecast", usage.get("forecast")),
            ("Budget", budget.get("monthly_amount") if budget else "none"),
        ]
    )
    if usage.get("by_model"):
        print()
        output.table(
            ["MODEL", "TIER", "GPU-HOURS", "COVERED", "AMOUNT", "CREDITED"],
            [
                (
                    r["model"],
                    r["tier"],
                    r["gpu_hours"],
                    r["covered_hours"],
                    r["amount"],
                    r["credited"],
                )
                for r in usage["by_model"]
            ],
        )
    if usage.get("by_job"):
        print()
        output.table(
            ["JOB", "NAME", "GPU-HOURS", "AMOUNT"],
            [(r["job_id"], r["name"], r["gpu_hours"], r["amount"]) for r in usage["by_job"]],
        )
    return 0


# ---- helpers ---------------------------------------------------------------------------------


def _api(args: argparse.Namespace) -> Api:
    try:
        login = config.load()
    except config.ConfigError as exc:
        raise ApiError(str(exc), exit_code=2) from exc
    return Api(login.url, login.token, timeout=args.timeout)


def _only_project(api: Api) -> str:
    slugs = [p["slug"] for p in api.get("/api/v1/projects", {"limit": 1000}).get("results", [])]
    if len(slugs) == 1:
        return str(slugs[0])
    listed = ", ".join(slugs) if slugs else "none"
    raise ApiError(f"Name the project with --project (yours: {listed}).", exit_code=2)


def _gpus(job: dict[str, Any]) -> str:
    milli = job.get("gpu_milli") or 1000
    if milli < 1000:
        return f"{milli / 1000:g}"
    count = job.get("gpus") or 0
    nodes = job.get("nodes")
    return f"{nodes}x{count}" if nodes and nodes > 1 else str(count)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ApiError(f"Cannot read {path}: {exc.strerror}.", exit_code=2) from exc


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        raise ApiError("Give the portal's address with --url.", exit_code=2)
    return input(prompt)


def _job(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a job id is a number, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the API's JSON, for scripts")
    common.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the portal"
    )

    parser = argparse.ArgumentParser(
        prog="gpucloud", description="GPU Cloud Portal from the command line."
    )
    parser.add_argument("--version", action="version", version=f"gpucloud {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = add("login", cmd_login, "store the portal's URL and an API token (file mode 0600)")
    p.add_argument("--url", help="the portal's address, e.g. https://portal.example.org")
    p.add_argument("--token", help="an API token (- reads it from standard input)")
    add("logout", cmd_logout, "forget the stored token")

    for name, func, help_text in [
        ("submit", cmd_submit, "submit a job (flags, or -f a Kubernetes Job manifest)"),
        ("dry-run", cmd_dry_run, "what would happen: admission, start, queue position, cost"),
    ]:
        p = add(name, func, help_text)
        p.add_argument("-f", "--file", help="Kubernetes Job manifest (- for standard input)")
        for flag, _, options in JOB_FLAGS:
            p.add_argument(flag, **options)
        p.add_argument("--idempotency-key", help="reuse to retry safely (default: a new one)")
        p.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command to run")

    p = add("ls", cmd_ls, "list your jobs, newest first")
    p.add_argument("--state", help="comma-separated states, e.g. queued,running")
    p.add_argument("--project", help="only this project")
    p.add_argument("--limit", type=int, default=50)

    p = add("status", cmd_status, "a job: state, why it waits, queue position, start, cost")
    p.add_argument("job", type=_job)

    p = add("logs", cmd_logs, "a job's output")
    p.add_argument("job", type=_job)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls with -f")

    p = add("cancel", cmd_cancel, "cancel a job")
    p.add_argument("job", type=_job)
    p.add_argument("--idempotency-key", help="reuse to retry safely (default: a new one)")

    p = add("usage", cmd_usage, "a project's usage and cost this month")
    p.add_argument("--project", help="project slug (default: your only project)")
    p.add_argument("--month", help="YYYY-MM (default: this month)")

    volumes.add_parser(sub, common, _with_project)
    return parser


def _with_project(
    func: Callable[[argparse.Namespace, Api, str], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        api = _api(args)
        return func(args, api, args.project or _only_project(api))

    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    try:
        result: int = args.func(args)
        return result
    except ApiError as exc:
        print(f"gpucloud: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
