"""Browser tests: Playwright driving the system's headless Chromium against the live server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls made by fixtures
# around it are still plain synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _chromium_path() -> str | None:
    return (
        os.environ.get("CHROMIUM_PATH")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    path = _chromium_path()
    if not path:
        pytest.fail("Chromium is not installed; `make test` installs Debian's chromium package.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=path,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server) -> Iterator[object]:
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def asgi_server(transactional_db) -> Iterator[str]:
    """The portal under uvicorn (ASGI), as the events service runs it: pushed updates work.
    (pytest-django's live server is WSGI, where the stream answers 204 and pages poll.)"""
    import socket
    import threading

    import uvicorn
    from django.core.asgi import get_asgi_application

    from tests.polling import wait_for

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        get_asgi_application(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=15)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()
