"""Help → Diagnostics on the real app: the real `phoenix-chat doctor` process runs (off the GUI
thread), its report reaches the dialog, Copy puts it on the clipboard and Save… writes it."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QFileDialog

from phoenix_chat.app.views.diagnostics_dialog import RUNNING_TEXT

REPORT_TIMEOUT_MS = 180_000  # the self-test compiles a few kernels on lavapipe, on a busy 2-core box


def test_diagnostics_shows_copies_and_saves_the_doctor_report(make_app, qtbot, tmp_path, monkeypatch):
    app = make_app(autoload=False)
    ctl = app.diagnostics
    app.window.diagnostics_action.trigger()
    dialog = ctl.dialog
    assert dialog is not None and dialog.isVisible()
    assert dialog.note.text() == RUNNING_TEXT and not dialog.save_button.isEnabled()
    assert ctl.process is not None  # running in its own process: the GUI thread is free meanwhile
    qtbot.waitUntil(lambda: ctl.process is None, timeout=REPORT_TIMEOUT_MS)
    text = dialog.report()
    assert text.startswith("# phoenix-chat doctor"), dialog.note.text()
    assert "## System" in text and "## Vulkan" in text and "## NPU" in text and "self-test" in text
    assert "Copy or Save" in dialog.note.text()

    dialog.copy_button.click()
    assert QApplication.clipboard().text() == text

    out = tmp_path / "report.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), "Markdown (*.md)"))
    dialog.save_button.click()
    assert out.read_text(encoding="utf-8") == text
    assert str(out) in dialog.note.text()

    dialog.reject()
    qtbot.waitUntil(lambda: ctl.dialog is None)


def test_closing_the_dialog_ends_a_running_report(make_app, qtbot):
    app = make_app(autoload=False)
    ctl = app.diagnostics
    dialog = ctl.open_dialog()
    proc = ctl.process
    assert proc is not None
    qtbot.waitUntil(lambda: proc.processId() > 0, timeout=30_000)
    dialog.reject()
    assert ctl.process is None and ctl.dialog is None
    assert proc.state() == proc.ProcessState.NotRunning
