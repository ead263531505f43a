"""Every Model / Devices / File-model menu action, triggered as a user would, with its effect
checked where it happens: in the model info the real worker returns after loading the real
embedded model (issue 24: defects 1, 6, 7 and the About card of 9).

The worker's info carries what the engine applied (`quant`, `weight_types`, `backend`,
`device`, `context_length`, `path`), not what was asked for."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from phoenix_chat.app.settings import CONTEXT_CHOICES, QUANT_CHOICES, SettingsModel
from phoenix_chat.app.views.dialogs import ReloadQuestion
from phoenix_chat.engine.quantization import WeightQuant
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]
MATRICES, NORMS = 1 + 18 * 7, 1 + 18 * 6  # the 270M: tied embedding + 7 projections a layer; norms


def expected_types(quant: str, info: dict) -> dict:
    if quant == "file":
        return info["tensor_types"]
    if quant in ("q4_0", "q4_1", "q5_1"):  # the tied embedding keeps 8 bits, as llama.cpp keeps it here
        return {"Q8_0": 1, WeightQuant(quant).label: MATRICES - 1, "F32": NORMS}
    return {WeightQuant(quant).label: MATRICES, "F32": NORMS}


def pick(qtbot, app, action) -> dict:
    """Trigger a menu action and return the info of the model the worker loads because of it."""
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as loaded:
        action.trigger()
        assert app.window.load_progress.isVisible()
    return loaded.args[0]


def saved(home) -> dict:
    return json.loads((home / "settings.json").read_text())


def lavapipe_id(app) -> str:
    vulkan = [d for d in app.models.devices if d["kind"] == "vulkan"]
    if not vulkan:
        pytest.skip("no Vulkan device here (CI installs lavapipe)")
    return vulkan[0]["id"]


def test_each_quantization_loads_on_the_cpu_and_the_worker_reports_the_applied_type(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=2048)
    app = make_app()
    assert wait_loaded(qtbot, app)["quant"] == "file"
    entries = [a.text() for a in app.window.quant_group.actions()]
    assert entries == ["As in file", "Q4_0", "Q4_1", "Q5_1", "Q8_0", "F16"]  # smallest first
    for quant in (*QUANT_CHOICES[1:], "file"):
        info = pick(qtbot, app, app.window.quant_actions[quant])
        assert info["backend"] == "cpu" and info["quant"] == quant
        assert info["weight_types"] == expected_types(quant, info)
        assert saved(home)["quant"] == quant
        assert app.window.quant_actions[quant].isChecked()
        if quant != "file":
            assert WeightQuant(quant).label in app.window.model_label.text()
            assert "computed in f32" in app.window.model_label.text()


def test_each_quantization_loads_on_vulkan_lavapipe_from_the_backend_menu(qtbot, make_app, home):
    preset(home, context_length=2048)
    app = make_app(autoload=False)
    qtbot.waitUntil(lambda: bool(app.models.devices), timeout=120_000)
    device = lavapipe_id(app)
    info = pick(qtbot, app, app.window.backend_actions[device])  # Devices → Backend → llvmpipe
    assert info["backend"] == "vulkan" and "llvmpipe" in info["device"]
    assert info["quant"] == "file" and info["weight_types"] == info["tensor_types"]
    for quant in QUANT_CHOICES[1:]:
        info = pick(qtbot, app, app.window.quant_actions[quant])
        assert info["backend"] == "vulkan" and info["quant"] == quant
        assert info["weight_types"] == expected_types(quant, info)
        assert saved(home)["quant"] == quant and saved(home)["backend"] == device


def test_an_old_settings_file_with_upper_case_quant_still_loads(qtbot, make_app, home):
    """Version 1 saved "Q8_0"; the engine refused it on every start (issue 24, defect 1)."""
    (home / "settings.json").write_text(json.dumps({"version": 1, "quant": "Q8_0", "context_length": 2048}))
    app = make_app()
    info = wait_loaded(qtbot, app)
    assert info["quant"] == "q8_0" and info["weight_types"] == expected_types("q8_0", info)
    assert app.window.quant_actions["q8_0"].isChecked()


def test_backend_context_npu_and_reload_menus_reach_the_worker(qtbot, make_app, home):
    from phoenix_chat.engine.devices import list_devices

    preset(home, backend="cpu")
    app = make_app()
    qtbot.waitUntil(lambda: bool(app.models.devices), timeout=120_000)
    first = wait_loaded(qtbot, app)
    # the default context is "auto": on this machine the 270M's whole limit fits
    assert first["backend"] == "cpu" and first["context_length"] == first["max_context_length"]
    # Devices → Backend → Auto: a hardware GPU if there is one, else the CPU, and it says why.
    hardware = any(d.kind == "vulkan" and d.available and not d.details.get("software") for d in list_devices())
    info = pick(qtbot, app, app.window.backend_actions["auto"])
    assert info["backend"] == ("vulkan" if hardware else "cpu")
    assert info["backend_note"].startswith("auto:")
    # Devices → Backend → CPU again.
    assert pick(qtbot, app, app.window.backend_actions["cpu"])["backend"] == "cpu"
    # Devices → Context length → each number ("Auto": the test below).
    for n in [c for c in CONTEXT_CHOICES if c not in (None, 4096)] + [4096]:
        info = pick(qtbot, app, app.window.context_actions[n])
        assert info["context_length"] == n
        assert saved(home)["context_length"] == n
    # Devices → NPU: greyed, with the reason, when there is none; triggering it does nothing.
    prefill = app.window.npu_actions["prefill"]
    if not app.models.npu["present"]:
        assert not prefill.isEnabled() and app.window.npu_reason_action.isVisible()
        assert app.models.npu["reason"] in app.window.npu_reason_action.text()
        prefill.trigger()
        assert app.settings.values.npu == "off" and app.models.load_id is None
    # Model → Reload model: a fresh load in the same worker.
    pid, before = app.worker.process.pid, app.models.info
    info = pick(qtbot, app, app.window.reload_action)
    assert info is not before and info["context_length"] == 4096 and app.worker.process.pid == pid


def test_context_auto_loads_the_models_own_limit_when_it_fits(qtbot, make_app, home):
    """Auto context (None): the largest the model and the memory budget allow — the 270M's whole
    32,768 on this machine."""
    preset(home, backend="cpu", context_length=2048)
    app = make_app()
    wait_loaded(qtbot, app)
    info = pick(qtbot, app, app.window.context_actions[None])
    assert saved(home)["context_length"] is None
    assert info["context_length"] == info["max_context_length"]


def test_about_this_model_is_a_readable_card(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=2048, quant="q8_0")
    app = make_app()
    info = wait_loaded(qtbot, app)
    app.window.model_info_action.trigger()
    card = app.models.info_dialog
    assert card is not None and card.isVisible()
    rows = dict(card.rows)
    assert rows["Model"] == info["name"]
    assert rows["Architecture"] == "gemma3, 18 layers"
    assert rows["Parameters"].endswith("million")
    assert rows["Kind"].startswith("Base model")  # the embedded 270M is not instruction-tuned
    assert rows["Weights"].startswith("Re-quantized to Q8_0 on load: Q8_0 ×127")
    assert "Q4_K" in rows["In the file"]
    assert rows["Context"] == "2,048 tokens (the model allows 32,768)"
    assert rows["File"].startswith(info["path"]) and "MiB" in rows["File"]
    assert "tensor_types" not in card.text() and "{" not in card.text()


def test_open_file_folder_recent_and_embedded_load_in_the_worker(qtbot, make_app, home, monkeypatch, draft_path, gguf):
    from tests.tinymodels import hf_gemma3_folder

    folder = hf_gemma3_folder(gguf, home / "hf-2-layers", 2, tokenizer=True)
    preset(home, backend="cpu", context_length=2048)
    app = make_app()
    embedded = wait_loaded(qtbot, app)
    assert embedded["layers"] == 18
    # File → Open GGUF file… (the dialog answers with a real 12-layer cut of the model)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(draft_path), ""))
    info = pick(qtbot, app, app.window.open_file_action)
    assert info["path"] == str(draft_path) and info["layers"] == 12
    assert saved(home)["model_path"] == str(draft_path)
    assert saved(home)["recent_models"] == [str(draft_path)]
    # File → Open Hugging Face folder…
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    info = pick(qtbot, app, app.window.open_folder_action)
    assert info["path"] == str(folder) and info["layers"] == 2 and info["tensor_types"].get("BF16")
    assert saved(home)["recent_models"] == [str(folder), str(draft_path)]
    # File → Use the embedded model
    info = pick(qtbot, app, app.window.embedded_action)
    assert info["path"] == embedded["path"] and info["layers"] == 18 and saved(home)["model_path"] is None
    # File → Recent models → the GGUF
    recent = {a.data(): a for a in app.window.recent_menu.actions()}
    info = pick(qtbot, app, recent[str(draft_path)])
    assert info["layers"] == 12


def test_a_file_that_cannot_be_opened_keeps_the_working_model(qtbot, make_app, home, monkeypatch, tmp_path):
    """Issue 24, defect 7: the failed file unloaded the model, became the default and stayed in Recent."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(60))
    preset(home, backend="cpu", context_length=2048, max_tokens=2, temperature=0.0)
    app = make_app()
    before = wait_loaded(qtbot, app)
    pid = app.worker.process.pid
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(bad), ""))
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        app.window.open_file_action.trigger()
    assert "broken.gguf" in failed.args[0] and "Still using" in failed.args[0]
    # The worker still holds the model it had (its own info came back with the refusal) ...
    assert app.models.info == before and app.worker.model_info == before
    assert app.models.load_id is None and not app.window.load_progress.isVisible()
    assert "not loaded" not in app.window.model_label.text()
    # ... the settings and Recent models never took the file ...
    assert saved(home)["model_path"] is None and str(bad) not in saved(home)["recent_models"]
    assert SettingsModel(home).values.model_path is None
    assert str(bad) not in [a.data() for a in app.window.recent_menu.actions()]
    # ... and the next message is answered by it, with no reload.
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        app.chat.send("Hello")
    assert done.args[1] in ("length", "stop") and app.worker.process.pid == pid and app.models.info == before


def test_a_choice_that_fails_to_load_is_rolled_back_and_the_previous_model_reloaded(qtbot, make_app, home):
    """Issue 24, defect 1: a failing choice stayed in settings.json and failed every start."""
    preset(home, backend="cpu", context_length=2048)
    app = make_app()
    before = wait_loaded(qtbot, app)
    # A Vulkan device that is not there fails after the model was dropped (as a device lost
    # between the probe and the load would): the previous choice comes back and reloads.
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as back:
        with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
            app.settings.set("backend", "vulkan:7")  # what Devices → Backend → <device> does
    assert "Reloading the previous model" in failed.args[0]
    assert back.args[0]["backend"] == "cpu" and back.args[0]["context_length"] == before["context_length"]
    assert saved(home)["backend"] == "cpu" and app.window.backend_actions["cpu"].isChecked()
    assert "previous model is back" in app.window.chat.notice.text()


def test_a_choice_whose_load_is_cancelled_or_kills_the_engine_is_not_kept(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=2048, max_tokens=2, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    # Cancelled: the menus and settings.json go back to what loaded; the next message loads that.
    app.window.context_actions[8192].trigger()
    with qtbot.waitSignal(app.models.model_unavailable, timeout=LOAD_TIMEOUT_MS) as failed:
        qtbot.mouseClick(app.window.load_cancel, Qt.LeftButton)
    assert "cancelled" in failed.args[0] and "back on the last model that loaded" in failed.args[0]
    assert saved(home)["context_length"] == 2048 and app.window.context_actions[2048].isChecked()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=LOAD_TIMEOUT_MS + ANSWER_TIMEOUT_MS):
        app.chat.send("Hello")
    assert app.models.info["context_length"] == 2048
    # The engine dies while loading a new choice: the choice may be the cause, so it is undone.
    app.window.quant_actions["f16"].trigger()
    qtbot.waitUntil(lambda: app.window.load_progress.value() > 0, timeout=LOAD_TIMEOUT_MS)
    with qtbot.waitSignal(app.worker.worker_died, timeout=10_000):
        app.worker.process.kill()
    assert saved(home)["quant"] == "file" and app.window.quant_actions["file"].isChecked()


def long_answer(qtbot, app):
    app.chat.set_chat_mode("chat")  # completion mode (the base model's default) would end at a blank line
    app.chat.send("Tell me a long story about a phoenix.")
    qtbot.waitUntil(lambda: bool(app.worker.generations) and app.chat.answer_text != "", timeout=ANSWER_TIMEOUT_MS)


def test_a_reload_choice_during_an_answer_asks_and_stop_reloads_at_once(qtbot, make_app, home):
    """Issue 24, defect 6: the reload queued silently behind the answer."""
    preset(home, backend="cpu", context_length=2048, max_tokens=400, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    long_answer(qtbot, app)
    app.window.quant_actions["q8_0"].trigger()
    box = app.models.reload_question
    assert box is not None and box.isVisible() and "quantization" in box.text()
    assert app.models.load_id is None  # nothing sent to the worker while the user decides
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as loaded:
        with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
            qtbot.mouseClick(box.choices[ReloadQuestion.STOP], Qt.LeftButton)
            assert "Stopping the answer, then reloading" in app.window.statusBar().currentMessage()
    assert finished.args[1] == "cancelled"
    assert loaded.args[0]["quant"] == "q8_0"


def test_a_reload_choice_during_an_answer_can_wait_for_it_or_be_undone(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=2048, max_tokens=120, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    order: list[str] = []
    app.chat.answer_finished.connect(lambda *_: order.append("answer"))
    app.models.model_ready.connect(lambda info: order.append(f"model {info['context_length']}"))
    # "Reload when the answer is finished": the answer runs to its end, then the model reloads.
    long_answer(qtbot, app)
    app.window.context_actions[8192].trigger()
    with qtbot.waitSignal(app.models.model_ready, timeout=ANSWER_TIMEOUT_MS + LOAD_TIMEOUT_MS):
        qtbot.mouseClick(app.models.reload_question.choices[ReloadQuestion.WAIT], Qt.LeftButton)
        assert "when the answer is finished" in app.window.statusBar().currentMessage()
        assert "reloads after this answer" in app.window.model_label.text()
    assert order == ["answer", "model 8192"]
    assert app.store.messages(app.chat.conversation_id)[-1].stats["finish_reason"] != "cancelled"
    # "Keep the current model": the choice is undone, nothing reloads.
    long_answer(qtbot, app)
    app.window.quant_actions["f16"].trigger()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(app.models.reload_question.choices[ReloadQuestion.KEEP], Qt.LeftButton)
        assert app.settings.values.quant == "file" and saved(home)["quant"] == "file"
        assert app.window.quant_actions["file"].isChecked()
    qtbot.wait(300)
    assert app.models.load_id is None and app.models.info["quant"] == "file"
    assert order == ["answer", "model 8192", "answer"]
    # Model → Reload model asks too.
    long_answer(qtbot, app)
    app.window.reload_action.trigger()
    assert app.models.reload_question is not None and "Reload model" in app.models.reload_question.text()
    assert app.models.load_id is None
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(app.models.reload_question.choices[ReloadQuestion.KEEP], Qt.LeftButton)
    qtbot.wait(300)
    assert app.models.load_id is None and order == ["answer", "model 8192", "answer", "answer"]
