"""`rsnotify hub` and `rsnotify worker`: every HubSettings field is an option with its RSNOTIFY_* variable.

Precedence: flag, then environment variable, then the settings default.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any
from urllib.parse import urlsplit

import click

from rsnotify.websub import SIGNATURE_ALGORITHMS

from .errors import SettingsError
from .logs import LOG_FORMATS, configure_logging
from .redis_url import redacted
from .settings import HubSettings, env_name, parse_token

# option names that differ from the field name (singular, because they repeat)
OPTION_NAMES = {"publish_tokens": "publish-token", "allow_networks": "allow-network",
                "trusted_proxies": "trusted-proxy"}
WORKER_SKIPS = frozenset({"workers"})  # meaningless for a worker process
# Web-only settings: a worker still accepts them (the embedded hub passes its whole settings to its
# child workers through RSNOTIFY_* variables; host and port make the default hub URL) but its
# --help does not show them.
WEB_ONLY = frozenset({"host", "port", "lease_default", "lease_min", "lease_max", "intent_ttl", "max_body",
                      "publish_tokens", "tokens_file", "admin_token", "trusted_proxies",
                      "min_replicas", "replica_timeout", "dormant_after"})
# --help shows these first, then everything else under "Tuning options"
ESSENTIAL = {
    "hub": frozenset({"host", "port", "public_url", "redis_url", "data_dir", "workers", "secret_key",
                      "tokens_file", "publish_tokens", "admin_token", "log_format", "log_level"}),
    "worker": frozenset({"redis_url", "public_url", "secret_key", "data_dir", "log_format", "log_level",
                         "concurrency", "name", "queues", "burst"}),
}
# settings whose values are a fixed list: shown as choices, and refused with the list
CHOICES = {"log_format": LOG_FORMATS, "signature_algorithm": tuple(SIGNATURE_ALGORITHMS)}
# help that reads differently for a worker process
WORKER_HELP = {
    "redis_url": "The hub's Redis (redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://): the one "
                 "its web process uses. Required.",
    "public_url": "The hub's URL (its --public-url), sent to subscribers as rel=\"hub\" "
                  "[default: http://RSNOTIFY_HOST:RSNOTIFY_PORT/].",
    "data_dir": "Where the hub keeps its generated secret key (DATA_DIR/secret.key) when --secret-key is not given.",
}
METAVARS = {"host": "ADDRESS", "public_url": "URL", "redis_url": "URL", "data_dir": "DIR", "tokens_file": "FILE",
            "admin_token": "TOKEN", "queue_name": "NAME", "sentinel_password": "PASSWORD", "redis_ca_file": "FILE",
            "redis_cert_file": "FILE", "redis_key_file": "FILE", "min_replicas": "N"}
LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)
WILDCARD_HOSTS = ("0.0.0.0", "::")


class GroupedOption(click.Option):
    """An option that knows which --help section it belongs to."""

    def __init__(self, *args: Any, essential: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.essential = essential


class GroupedCommand(click.Command):
    """--help lists the essential options first, then the tuning ones."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Essential options": [], "Tuning options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            essential = getattr(param, "essential", True)   # --help itself counts as essential
            sections["Essential options" if essential else "Tuning options"].append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _token(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(parse_token(v) for v in values)
    except SettingsError as exc:
        raise click.BadParameter(str(exc)) from None


def option_name(field_name: str) -> str:
    return "--" + OPTION_NAMES.get(field_name, field_name.replace("_", "-"))


def settings_options(command_name: str, skip: frozenset[str] = frozenset(),
                     hide: frozenset[str] = frozenset()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator adding one option per HubSettings field (help from the field's metadata)."""
    essential = ESSENTIAL[command_name]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(fields(HubSettings)):
            if f.name in skip:
                continue
            default = None if f.default is MISSING else f.default
            help_text = (WORKER_HELP.get(f.name) if command_name == "worker" else None) or f.metadata["help"]
            kwargs: dict[str, Any] = {"envvar": env_name(f.name), "show_envvar": True, "help": help_text,
                                      "hidden": f.name in hide, "essential": f.name in essential}
            if f.name == "publish_tokens":
                kwargs.update(multiple=True, callback=_token, metavar="TOKEN=PREFIX")
            elif f.name in ("allow_networks", "trusted_proxies"):
                kwargs.update(multiple=True, metavar="CIDR")
            elif f.name == "secret_key":
                kwargs.update(default=None, metavar="KEY")
            elif f.name in CHOICES:
                kwargs.update(default=default, show_default=True, type=click.Choice(CHOICES[f.name]))
            else:
                like = default if f.metadata.get("like") is None else f.metadata["like"]
                kwargs.update(default=default, show_default=default is not None,
                              type=type(like) if like is not None else str)
            if f.name in METAVARS:
                kwargs["metavar"] = METAVARS[f.name]
            command = click.option(option_name(f.name), f.name, cls=GroupedOption, **kwargs)(command)
        return command

    return decorate


def _in_option_words(message: str) -> str:
    """A settings message with each field name written as the option a user types (`--lease-min`)."""
    for f in sorted(fields(HubSettings), key=lambda f: -len(f.name)):
        message = re.sub(rf"(?<![\w-]){f.name}(?![\w-])", option_name(f.name), message)
    return message


def build_settings(values: dict[str, Any]) -> HubSettings:
    """HubSettings from the options' values; bad values or combinations become a usage error."""
    known = {f.name for f in fields(HubSettings)}
    chosen: dict[str, Any] = {k: (tuple(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in values.items() if k in known}
    check_redis_url(chosen.get("redis_url"))
    try:
        return HubSettings(**chosen)
    except SettingsError as exc:
        raise click.UsageError(_in_option_words(str(exc))) from None


class RedisUrlError(click.ClickException):
    exit_code = 2   # a usage error, said in one line (the URL is the whole problem)


def check_redis_url(url: str | None) -> None:
    """A bad --redis-url: one line naming what is wrong, exit 2."""
    from .redis_url import parse_redis_url

    if url is None:
        return
    try:
        parse_redis_url(url)
    except SettingsError as exc:
        raise RedisUrlError(_in_option_words(str(exc))) from None


def check_public_url(settings: HubSettings) -> None:
    """Refuse a hub URL on 0.0.0.0 or ::: publishers must name the hub's URL in their Link
    headers, and no client can reach those addresses, so every publish would be refused."""
    host = urlsplit(settings.hub_url).hostname or ""
    if host not in WILDCARD_HOSTS:
        return
    if settings.public_url:
        raise click.UsageError(f"--public-url {settings.public_url} names {host}, an address no client can "
                               "reach: give the URL publishers and subscribers use, e.g. "
                               "--public-url https://hub.example.org/")
    raise click.UsageError(
        f"--host {settings.host} listens on every address, so the hub cannot tell which URL publishers and "
        f"subscribers use (it would advertise {settings.hub_url}, and refuse every publish naming the real "
        "one): give --public-url (RSNOTIFY_PUBLIC_URL), e.g. --public-url https://hub.example.org/")


def check_data_dir(settings: HubSettings) -> None:
    """--data-dir must be a folder or creatable as one: a file there (or on the way) is a usage
    error now, not an "[Errno 17] File exists" once Redis or the key file needs it."""
    path = settings.data_path
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                what = "is a file" if candidate == path else f"is inside {candidate}, which is a file"
                raise click.BadParameter(f"{settings.data_dir} {what}; expected a folder (created if missing)",
                                         param_hint="--data-dir")
            return


def warn_without_workers(settings: HubSettings) -> None:
    """--workers 0 on the embedded Redis: nothing would verify or deliver, and nothing else would say so."""
    if settings.is_embedded and settings.workers == 0:
        sock = settings.data_path / "redis.sock"
        click.echo(f"warning: --workers 0 with the embedded Redis: no subscription is verified and no "
                   f"notification delivered until a worker runs against this hub's Redis: "
                   f"rsnotify worker --redis-url unix://{sock}", err=True)


@click.command(cls=GroupedCommand)
@settings_options("hub")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True, envvar="RSNOTIFY_LOG_LEVEL",
              show_envvar=True, help="Logging threshold.", cls=GroupedOption, essential=True)
def hub(log_level: str, **values: Any) -> None:
    """Run a WebSub hub for ResourceSync change notifications.

    Without --redis-url it starts its own redis-server (data and AOF in --data-dir) and
    --workers delivery workers; Ctrl-C stops everything cleanly.
    """
    # imported when the command runs: aiohttp, Redis and RQ stay unloaded for `--help` and the other commands
    from .embedded import EmbeddedError, run_hub

    settings = build_settings(values)
    check_public_url(settings)
    check_data_dir(settings)
    warn_without_workers(settings)
    configure_logging(log_level, settings.log_format)
    try:
        run_hub(settings, log_level=log_level.upper(), announce=lambda text: click.echo(text))
    except (EmbeddedError, SettingsError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # Redis unreachable at --redis-url, and the like
        raise click.ClickException(f"cannot start the hub: {exc}") from None
    except _redis_errors() as exc:
        raise click.ClickException(f"cannot use Redis at {redacted(str(settings.redis_url))}: {exc}") from None


@click.command(cls=GroupedCommand)
@settings_options("worker", skip=WORKER_SKIPS, hide=WEB_ONLY)
@click.option("--burst", is_flag=True, help="Stop when the queues are empty.", cls=GroupedOption, essential=True)
@click.option("--queues", multiple=True, metavar="NAME", cls=GroupedOption, essential=True,
              help="Queue to work on (repeatable) [default: --queue-name].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, cls=GroupedOption, essential=True,
              help="Subscriptions served at once [default: --delivery-concurrency].")
@click.option("--name", default=None, help="Worker name [default: generated].", cls=GroupedOption, essential=True)
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True, envvar="RSNOTIFY_LOG_LEVEL",
              show_envvar=True, help="Logging threshold.", cls=GroupedOption, essential=True)
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
    check_public_url(settings)
    check_data_dir(settings)
    configure_logging(log_level, settings.log_format)
    if parent_pid is not None:
        watch_parent(parent_pid)
    try:
        run_worker(settings, burst=burst, queues=tuple(queues), concurrency=concurrency, name=name)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    except _redis_errors() as exc:
        raise click.ClickException(f"cannot use Redis at {redacted(str(settings.redis_url))}: {exc}") from None


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
