"""What a command does with ``TRAJLAKE_HOME``: read an existing lakehouse, or say where it created one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from trajlake.console import print_note

if TYPE_CHECKING:
    from common.settings import Settings
    from warehouse.lakehouse import Lakehouse


def settings_for(use: str) -> Settings:
    """The settings of a command, checked for what it does with ``TRAJLAKE_HOME``.

    Args:
        use: ``read`` (needs an existing lakehouse: refused otherwise) or ``any`` (may create
            TRAJLAKE_HOME; see :func:`announce_new_lakehouse` for commands that create the lakehouse).

    Raises:
        ConfigError: a setting is invalid, or ``read`` and TRAJLAKE_HOME holds no lakehouse.
    """
    from common.settings import load_settings

    settings = load_settings()
    return settings.require_lakehouse() if use == "read" else settings


def open_lakehouse(settings: Settings) -> Lakehouse:
    """The lakehouse of a command that reads it (settings from :func:`settings_for`), opened once and passed on."""
    from warehouse.lakehouse import Lakehouse

    return Lakehouse.open(settings)


@contextmanager
def announce_new_lakehouse(settings: Settings) -> Iterator[None]:
    """Around a command that may create the lakehouse: once it succeeded, say where it created one."""
    from common.settings import CATALOG_FILE

    catalog = settings.home_path / CATALOG_FILE
    new = not settings.catalog_is_external and not catalog.exists()
    yield
    if new and catalog.exists():
        print_note(f"new lakehouse at {settings.home_path} (TRAJLAKE_HOME)")
