"""The root `rsnotify` command group; each role's commands are loaded lazily.

`rsnotify validate` lives in `rsnotify.validate_cli`; `hub`/`worker` in `hub.cli`;
`publish`/`capability-list` in `publisher.cli`; `subscribe` in `subscriber.cli`; `inspect` in
`subscriber.inspect_cli`.
"""
from __future__ import annotations

import importlib
import importlib.util

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

    def _available(self) -> list[str]:
        return [name for name in LAZY_COMMANDS if importlib.util.find_spec(LAZY_COMMANDS[name].split(":")[0]) is not None]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rsnotify")
def main() -> None:
    """rsnotify: ResourceSync change notifications over WebSub.

    Run a hub, publish change notifications, subscribe to them, validate documents.
    """
