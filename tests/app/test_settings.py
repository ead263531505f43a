"""The typed settings model: defaults, validation, persistence, notifications."""

from __future__ import annotations

import dataclasses
import json

import pytest

from phoenix_chat.app.settings import Settings, SettingsModel
from phoenix_chat.engine.sampling import SamplingParams


def test_defaults_persist_and_notify(home):
    model = SettingsModel(home)
    assert model.values == Settings()
    seen = []
    model.subscribe(lambda name, value: seen.append((name, value)))
    model.set("quant", "q8_0")
    model.set("quant", "Q8_0")  # the same choice in another case: no change, no notification
    model.set("context_length", 2048)
    model.add_recent_model("/models/a.gguf")
    model.add_recent_model("/models/b.gguf")
    model.add_recent_model("/models/a.gguf")
    assert seen[:2] == [("quant", "q8_0"), ("context_length", 2048)]
    again = SettingsModel(home).values
    assert again.quant == "q8_0" and again.context_length == 2048
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


def test_quant_is_spelt_as_the_engine_spells_it_and_old_files_migrate(home):
    """Issue 24, defect 1: version 1 wrote "Q8_0", which the engine refused on every start."""
    from phoenix_chat.app.settings import QUANT_CHOICES
    from phoenix_chat.engine.quantization import WeightQuant

    assert QUANT_CHOICES == ("file", *(q.value for q in WeightQuant))
    for old in ("Q4_0", "Q8_0", "F16"):
        (home / "settings.json").write_text(json.dumps({"version": 1, "quant": old}))
        loaded = SettingsModel(home).values
        assert loaded.quant == old.lower()
        assert WeightQuant.parse(loaded.quant) is WeightQuant(old.lower())


def test_corrupt_file_falls_back_to_defaults(home):
    (home / "settings.json").write_text("{not json")
    assert SettingsModel(home).values == Settings()


def test_sampling_defaults_are_the_engines_and_stated_nowhere_else(qtbot):
    engine = SamplingParams()
    defaults = Settings().sampling_defaults()
    assert {k: v for k, v in defaults.items() if k != "max_tokens"} == {
        k: getattr(engine, k) for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
    }
    # The CLI states none: a flag left out is the engine's default, a flag given overrides it.
    from phoenix_chat.app.cli import _sampling, build_parser

    assert _sampling(build_parser().parse_args(["run", "hi"])) == engine
    assert _sampling(build_parser().parse_args(["chat", "--top-k", "5", "--seed", "3"])) == dataclasses.replace(
        engine, top_k=5, seed=3
    )
    # The chat settings dialog shows what it is given (no fallbacks of its own).
    from phoenix_chat.app.views.dialogs import ChatSettingsDialog

    dialog = ChatSettingsDialog("terse", defaults)
    qtbot.addWidget(dialog)
    assert dialog.values() == ("terse", defaults)


def test_new_chat_defaults_are_checked_together_and_persist(home):
    model = SettingsModel(home)
    sampling = {**model.values.sampling_defaults(), "temperature": 0.3, "top_k": 7, "max_tokens": 99}
    model.set_new_chat_defaults("Be brief.", sampling)
    again = SettingsModel(home).values
    assert again.system_prompt == "Be brief." and again.sampling_defaults() == sampling
    # one bad value: nothing of the call is stored
    with pytest.raises(ValueError):
        model.set_new_chat_defaults("Changed", {**sampling, "top_k": 5, "top_p": 1.5})
    with pytest.raises(KeyError):
        model.set_new_chat_defaults("Changed", {**sampling, "seed": 1})
    assert SettingsModel(home).values == again
    # a bad hand edit of the file is ignored, field by field (the default instead)
    data = json.loads((home / "settings.json").read_text())
    (home / "settings.json").write_text(json.dumps({**data, "temperature": "hot", "top_k": -1, "min_p": 0.1}))
    loaded = SettingsModel(home).values
    assert (loaded.temperature, loaded.top_k) == (Settings().temperature, Settings().top_k)
    assert loaded.min_p == 0.1 and loaded.system_prompt == "Be brief."
