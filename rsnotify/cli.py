"""The root `rsnotify` command group; each role's commands are loaded lazily.

`rsnotify validate` lives in `rsnotify.validate_cli`; `hub`/`worker` in `hub.cli`;
`publish`/`capability-list` in `publisher.cli`; `subscribe` in `subscriber.cli`.
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
    "source": "rsnotify.publisher.source.cli:source",
}


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
