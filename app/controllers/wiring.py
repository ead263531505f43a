"""Signal wiring as tables: a controller names each hook of a view, window or worker once, with
the slot it goes to, instead of a `.connect` line per signal."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtGui import QActionGroup

from phoenix_chat.app.settings import SettingsModel


def connect(source: QObject, **slots: Callable) -> None:
    """`source.<name>.connect(slot)` for each `name=slot`; a misspelt signal fails at startup."""
    for name, slot in slots.items():
        getattr(source, name).connect(slot)


def connect_actions(window: QObject, **slots: Callable) -> None:
    """`window.<name>.triggered.connect(slot)` for each menu action `name=slot`."""
    for name, slot in slots.items():
        getattr(window, name).triggered.connect(slot)


def choice_sets(
    group: QActionGroup, settings: SettingsModel, key: str, convert: Callable = lambda value: value
) -> None:
    """Picking an action of `group` stores its data() (through `convert`) as setting `key`."""
    group.triggered.connect(lambda action: settings.set(key, convert(action.data())))
