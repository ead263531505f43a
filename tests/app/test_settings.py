"""The typed settings model: defaults, validation, persistence, notifications."""
from __future__ import annotations

import json

import pytest

from app.settings import Settings, SettingsModel


def test_defaults_persist_and_notify(home):
    model = SettingsModel(home)
    assert model.values == Settings()
    seen = []
    model.subscribe(lambda name, value: seen.append((name, value)))
    model.set("quant", "Q8_0")
    model.set("quant", "Q8_0")               # no change, no notification
    model.set("context_length", 2048)
    model.add_recent_model("/models/a.gguf")
    model.add_recent_model("/models/b.gguf")
    model.add_recent_model("/models/a.gguf")
    assert seen[:2] == [("quant", "Q8_0"), ("context_length", 2048)]
    again = SettingsModel(home).values
    assert again.quant == "Q8_0" and again.context_length == 2048
    assert again.recent_models == ["/models/a.gguf", "/models/b.gguf"]


def test_bad_values_are_refused_and_ignored_on_load(home):
    model = SettingsModel(home)
    with pytest.raises(ValueError):
        model.set("quant", "Q3_K")
    with pytest.raises(KeyError):
        model.set("no_such_setting", 1)
    (home / "settings.json").write_text(json.dumps({"quant": "bogus", "theme": "dark"}))
    loaded = SettingsModel(home).values
    assert loaded.quant == "file" and loaded.theme == "dark"


def test_corrupt_file_falls_back_to_defaults(home):
    (home / "settings.json").write_text("{not json")
    assert SettingsModel(home).values == Settings()
