"""The root `rsnotify` command group; each role's commands are loaded lazily.

`rsnotify validate` lives in `rsnotify.validate_cli`; `hub`/`worker` in `hub.cli`;
`publish`/`capability-list` in `publisher.cli`; `subscribe` in `subscriber.cli`; `inspect` in
`subscriber.inspect_cli`.
"""
from __future__ import annotations

import importlib
import importlib.util
from gettext import gettext as _

import click

from . import __version__

# command name -> "module:attribute"; modules are imported only when the command runs
LAZY_COMMANDS = {
    "validate": "rsnotify.validate_cli:validate",
    "admin": "rsnotify.admin_cli:admin",
    "hub": "rsnotify.hub.cli:hub",
    "worker": "rsnotify.hub.cli:worker",
    "publish": "rsnotify.publisher.cli:publish",
    "capability-list": "rsnotify.publisher.cli:capability_list",
    "subscribe": "rsnotify.subscriber.cli:subscribe",
    "sync": "rsnotify.subscriber.cli:sync",
    "audit": "rsnotify.subscriber.cli:audit",
    "inspect": "rsnotify.subscriber.inspect_cli:inspect",
    "source": "rsnotify.publisher.source.cli:source",
}

# command name -> the first paragraph of its help, for the command list of `rsnotify --help`:
# listing from here imports no role (the listing would otherwise load every command module, and
# with them aiohttp, lxml and the hub's settings). tests/rsnotify/test_cli_startup.py checks each
# against the command's own help, so the list cannot drift from the commands.
SUMMARIES = {
    "validate": "Check ResourceSync documents (change notifications, Capability Lists, Source Descriptions, "
                "Resource/Change Lists, Dumps, indexes); `-` reads standard input, an http(s) URL is fetched.",
    "admin": "Inspect and repair a running hub through its admin API.",
    "hub": "Run a WebSub hub for ResourceSync change notifications.",
    "worker": "Run a hub worker: verifications, thin-ping fetches, lease sweeps and fan-out deliveries.",
    "publish": "Publish resource changes to a hub as change notifications.",
    "capability-list": "Produce or edit a Capability List that advertises a change-notification channel.",
    "subscribe": "Subscribe to a change-notification channel and print each notification as a JSON line.",
    "sync": "Keep DIR equal to a Source: baseline, live notifications, catch-up after any gap.",
    "audit": "Compare DIR with the Source's current Resource List: exit 0 in sync, 1 differences, 2 usage, "
             "3 Source unreachable, 130 interrupted (Ctrl-C; 143 for SIGTERM). Works beside a running "
             "`rsnotify sync` (read-only); with --repair the running sync does the repair and this waits for "
             "its answer.",
    "inspect": "Show what the Source at URL offers: its Capability Lists, each capability's document (kind, "
               "at/completed or from/until, entries; indexes followed), the change-notification channel "
               "(topic, hubs), and every problem found on the way.",
    "source": "Serve the files of SRC under URL as a ResourceSync Source, and publish every change.",
}

# commands that need an optional extra -> the extra; and the modules each extra must bring (the
# commands import them only when they run, so a plain `pip install .` would fail half-way)
NEEDS_EXTRA = {"hub": "hub", "worker": "hub"}
EXTRA_MODULES = {"hub": ("redis", "rq", "cryptography", "prometheus_client", "limits")}


def is_extra_missing(extra: str) -> bool:
    """Is any module of `extra` not installed? (Looked up, not imported: `--help` stays fast.)"""
    for module in EXTRA_MODULES[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return True
        except (ImportError, ValueError):   # a broken or blocked installation counts as missing
            return True
    return False


def missing_extra_command(name: str, extra: str) -> click.Command:
    """A stand-in for a command whose extra is not installed: one line, exit 2, whatever the arguments."""

    def explain() -> None:
        click.echo(f"rsnotify {name} needs the {extra} extra: pip install 'rsnotify[{extra}]'", err=True)
        raise SystemExit(2)

    return click.Command(name, callback=explain, add_help_option=False, help=f"(needs: pip install 'rsnotify[{extra}]')",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use, so `rsnotify --help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._available()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        target = LAZY_COMMANDS.get(name)
        if target is None:
            return None
        extra = NEEDS_EXTRA.get(name)
        if extra is not None and is_extra_missing(extra):
            return missing_extra_command(name, extra)
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # that role is not built yet / not installed
                return None
            raise
        return getattr(module, attribute, None)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own command list, with SUMMARIES standing in for the commands not imported yet."""
        commands = [(name, command) for name in self.list_commands(ctx)
                    if (command := self._listed_command(ctx, name)) is not None and not command.hidden]
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _command in commands)
        with formatter.section(_("Commands")):
            formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in commands])

    def _listed_command(self, ctx: click.Context, name: str) -> click.Command | None:
        """The command if it is loaded or has no summary; else a stand-in carrying its summary."""
        if name in self.commands or name not in SUMMARIES:
            return self.get_command(ctx, name)
        extra = NEEDS_EXTRA.get(name)
        if extra is not None and is_extra_missing(extra):
            return missing_extra_command(name, extra)
        return click.Command(name, help=SUMMARIES[name])

    def _available(self) -> list[str]:
        return [name for name in LAZY_COMMANDS if importlib.util.find_spec(LAZY_COMMANDS[name].split(":")[0]) is not None]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rsnotify")
def main() -> None:
    """rsnotify: ResourceSync change notifications over WebSub.

    Run a hub, publish change notifications, subscribe to them, validate documents.
    """
