"""Where the portal's URL and the API token are kept: one JSON file per user, mode 0600.

`$GPUCLOUD_CONFIG` names the file; else `$XDG_CONFIG_HOME/gpucloud/config.json`, else
`~/.config/gpucloud/config.json`. `$GPUCLOUD_URL` and `$GPUCLOUD_TOKEN` override what it holds
(for CI jobs, where nobody logs in).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Login:
    url: str
    token: str


def config_path() -> Path:
    explicit = os.environ.get("GPUCLOUD_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpucloud" / "config.json"


def load() -> Login:
    """The saved login, with the environment's overrides; ConfigError when there is none."""
    saved: dict[str, str] = {}
    path = config_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Cannot read {path}: {exc}. Run `gpucloud login` again.") from exc
    url = os.environ.get("GPUCLOUD_URL") or saved.get("url", "")
    token = os.environ.get("GPUCLOUD_TOKEN") or saved.get("token", "")
    if not url or not token:
        raise ConfigError("Not logged in. Run `gpucloud login --url https://<portal>` first.")
    return Login(url=url, token=token)


def save(login: Login) -> Path:
    """Write the login so that only this user can read it (0600, created so; never wider)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        json.dump({"url": login.url, "token": login.token}, out)
    os.replace(tmp, path)
    return path


def forget() -> bool:
    path = config_path()
    if path.exists():
        path.unlink()
        return True
    return False
