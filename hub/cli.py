"""`rsnotify hub` and `rsnotify worker`: every HubSettings field is an option with its RSNOTIFY_* variable.

Precedence: flag, then environment variable, then the settings default.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from .errors import SettingsError
from .logs import configure_logging
from .settings import HubSettings, env_name, parse_token

# option names that differ from the field name (singular, because they repeat)
OPTION_NAMES = {"publish_tokens": "publish-token", "allow_networks": "allow-network"}
WORKER_SKIPS = frozenset({"workers"})  # meaningless for a worker process (host and port still make the hub URL)
LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)


def _token(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(parse_token(v) for v in values)
    except SettingsError as exc:
        raise click.BadParameter(str(exc)) from None


def settings_options(skip: frozenset[str] = frozenset()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator adding one option per HubSettings field (help from the field's metadata)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(fields(HubSettings)):
            if f.name in skip:
                continue
            default = None if f.default is MISSING else f.default
            kwargs: dict[str, Any] = {"envvar": env_name(f.name), "show_envvar": True, "help": f.metadata["help"]}
            if f.name == "publish_tokens":
                kwargs.update(multiple=True, callback=_token, metavar="TOKEN=PREFIX")
            elif f.name == "allow_networks":
                kwargs.update(multiple=True, metavar="CIDR")
            elif f.name == "secret_key":
                kwargs.update(default=None, metavar="KEY")
            else:
                kwargs.update(default=default, show_default=default is not None,
                              type=type(default) if default is not None else str)
            command = click.option(f"--{OPTION_NAMES.get(f.name, f.name.replace('_', '-'))}", f.name,
                                   **kwargs)(command)
        return command

    return decorate


def build_settings(values: dict[str, Any]) -> HubSettings:
    """HubSettings from the options' values; bad combinations become a usage error."""
    known = {f.name for f in fields(HubSettings)}
    chosen: dict[str, Any] = {k: (tuple(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in values.items() if k in known}
    try:
        return HubSettings(**chosen)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@settings_options()
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True, envvar="RSNOTIFY_LOG_LEVEL",
              show_envvar=True, help="Logging threshold.")
def hub(log_level: str, **values: Any) -> None:
    """Run a WebSub hub for ResourceSync change notifications.

    Without --redis-url it starts its own redis-server (data and AOF in --data-dir) and
    --workers delivery workers; Ctrl-C stops everything cleanly.
    """
    # imported when the command runs: aiohttp, Redis and RQ stay unloaded for `--help` and the other commands
    from .embedded import EmbeddedError, run_hub

    settings = build_settings(values)
    configure_logging(log_level, settings.log_format)
    try:
        run_hub(settings, log_level=log_level.upper(), announce=lambda text: click.echo(text))
    except (EmbeddedError, SettingsError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # Redis unreachable at --redis-url, and the like
        raise click.ClickException(f"cannot start the hub: {exc}") from None
    except _redis_errors() as exc:
        raise click.ClickException(f"cannot use Redis at {settings.redis_url}: {exc}") from None


@click.command()
@settings_options(skip=WORKER_SKIPS)
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.")
@click.option("--queues", multiple=True, metavar="NAME",
              help="Queue to work on (repeatable) [default: --queue-name].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Subscriptions served at once [default: --delivery-concurrency].")
@click.option("--name", default=None, help="Worker name [default: generated].")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True, envvar="RSNOTIFY_LOG_LEVEL",
              show_envvar=True, help="Logging threshold.")
@click.option("--parent-pid", type=int, default=None, hidden=True,
              help="Stop when this process (the embedded hub that started us) is gone.")
def worker(burst: bool, queues: tuple[str, ...], concurrency: int | None, name: str | None, log_level: str,
           parent_pid: int | None, **values: Any) -> None:
    """Run a hub worker: verifications, thin-ping fetches, lease sweeps and fan-out deliveries."""
    # imported when the command runs: RQ, aiohttp and the worker's code stay unloaded for `--help`
    from .worker.process import run_worker

    settings = build_settings(values)
    if settings.redis_url is None:
        raise click.UsageError("a worker needs --redis-url (RSNOTIFY_REDIS_URL): the hub's Redis")
    configure_logging(log_level, settings.log_format)
    if parent_pid is not None:
        watch_parent(parent_pid)
    try:
        run_worker(settings, burst=burst, queues=tuple(queues), concurrency=concurrency, name=name)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    except _redis_errors() as exc:
        raise click.ClickException(f"cannot use Redis at {settings.redis_url}: {exc}") from None


ORPHAN_STOP_TIMEOUT = 30.0  # s an orphaned worker gets to finish its job before it kills itself


def watch_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Stop this worker (SIGTERM to itself: RQ's warm stop) once the hub that started it is gone,
    so a hub killed with SIGKILL leaves no worker behind; SIGKILL itself if that hangs."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        logging.getLogger(__name__).warning("the hub (pid %s) is gone; this worker stops", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_STOP_TIMEOUT)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis  # only once a command failed: `--help` does not load the Redis client

    return (redis.RedisError,)
