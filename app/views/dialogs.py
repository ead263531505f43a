"""Small dialogs: chat settings (one conversation's, or the defaults for new ones), the model card,
the reload question. Layout only."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)


class ChatSettingsDialog(QDialog):
    """System prompt and sampling settings for one conversation.

    `sampling` has every field of `values()` (the controller merges the settings' defaults
    with the conversation's own): the dialog shows what it is given and has no defaults."""

    def __init__(
        self, system_prompt: str, sampling: dict, parent=None, *, title: str = "Chat settings", note: str = ""
    ):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText(
            "Optional instructions given to the model before the chat "
            "(Gemma has no system role: this text is put before your first message)."
        )
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setValue(float(sampling["temperature"]))
        self.temperature.setToolTip("0 = always the most likely token (greedy)")
        self.top_k = QSpinBox(minimum=0, maximum=1000)
        self.top_k.setValue(int(sampling["top_k"]))
        self.top_p = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.01, decimals=2)
        self.top_p.setValue(float(sampling["top_p"]))
        self.min_p = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.01, decimals=2)
        self.min_p.setValue(float(sampling["min_p"]))
        self.repetition_penalty = QDoubleSpinBox(minimum=1.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.repetition_penalty.setValue(float(sampling["repetition_penalty"]))
        self.max_tokens = QSpinBox(minimum=1, maximum=32768)
        self.max_tokens.setValue(int(sampling["max_tokens"]))
        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-k (0 = off)", self.top_k)
        form.addRow("Top-p (1 = off)", self.top_p)
        form.addRow("Min-p (0 = off)", self.min_p)
        form.addRow("Repetition penalty", self.repetition_penalty)
        form.addRow("Max answer tokens", self.max_tokens)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        if note:
            layout.addWidget(QLabel(note, wordWrap=True))
        layout.addLayout(form)
        layout.addWidget(buttons)

    def values(self) -> tuple[str, dict]:
        return self.system_prompt.toPlainText(), {
            "temperature": self.temperature.value(),
            "top_k": self.top_k.value(),
            "top_p": self.top_p.value(),
            "min_p": self.min_p.value(),
            "repetition_penalty": self.repetition_penalty.value(),
            "max_tokens": self.max_tokens.value(),
        }


def model_card_rows(info: dict) -> list[tuple[str, str]]:
    """The worker's model info as (label, text) rows a person reads: what the model is, how
    its weights are held, where it runs, how much it remembers, where it came from."""
    if info.get("remote"):  # a server's model: only what the server told us
        return [
            ("Model", str(info.get("model") or "?")),
            ("Runs on", f"a remote server at {info.get('host', '?')} (OpenAI-compatible API)"),
            ("Devices, weights", "the server's own: this computer's device and quantization menus do not apply"),
        ]
    rows = [
        ("Model", str(info.get("name") or "?")),
        ("Kind", _kind(info)),
        ("Architecture", f"{info.get('architecture', '?')}, {info.get('layers', '?')} layers"),
        ("Parameters", _count(int(info.get("parameters") or 0))),
        ("Weights", _weights(info)),
    ]
    if info.get("quant", "file") != "file":
        rows.append(("In the file", _types(info.get("tensor_types") or {})))
    rows.append(("Runs on", f"{info.get('backend', '?')} — {info.get('device', '?')}"))
    if info.get("backend_note"):
        rows.append(("Why there", str(info["backend_note"])))
    ctx, most = info.get("context_length"), info.get("max_context_length")
    rows.append(("Context", f"{ctx:,} tokens (the model allows {most:,})" if ctx and most else "?"))
    path = str(info.get("path") or "")
    size = int(info.get("file_size") or 0)
    rows.append(("File", f"{path} ({size / 2**20:,.1f} MiB)" if size else path))
    if info.get("load_s"):
        rows.append(("Loaded in", f"{float(info['load_s']):.1f} s"))
    return rows


def _kind(info: dict) -> str:
    if info.get("is_instruction_tuned", True):
        return "Instruction-tuned: answers chat messages"
    return "Base model: continues text, was not trained to answer"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} billion" if n >= 1e9 else f"{n / 1e6:.0f} million"


def _types(counts: dict) -> str:
    return ", ".join(f"{name} ×{n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _weights(info: dict) -> str:
    quant = str(info.get("quant") or "file")
    held = _types(info.get("weight_types") or info.get("tensor_types") or {})
    if quant == "file":
        return f"As in the file: {held}"
    text = f"Re-quantized to {quant.upper()} on load: {held}"
    if info.get("backend") == "cpu":
        text += " (values rounded to the type, computed in f32)"
    return text


class ModelInfoDialog(QDialog):
    """Model → About this model: the loaded model as a card of labelled rows."""

    def __init__(self, info: dict, parent=None):
        super().__init__(parent)
        self.setWindowTitle("About this model")
        self.setObjectName("modelInfoDialog")
        self.rows = model_card_rows(info)
        form = QFormLayout()
        for label, text in self.rows:
            value = QLabel(text)
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setTextFormat(Qt.TextFormat.PlainText)
            form.addRow(f"<b>{label}</b>", value)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
        self.setMinimumWidth(520)

    def text(self) -> str:
        """The card as plain lines (for tests and copying)."""
        return "\n".join(f"{label}: {text}" for label, text in self.rows)


class ReloadQuestion(QMessageBox):
    """Asked when a menu choice needs a reload while an answer is being written: stop the
    answer and reload now, reload once it is finished, or keep the current model. Window-modal
    and opened with open(), so the answer keeps streaming behind it."""

    STOP, WAIT, KEEP = "stop", "wait", "keep"

    def __init__(self, change: str, parent=None):
        super().__init__(parent)
        self.setObjectName("reloadQuestion")
        self.setIcon(QMessageBox.Icon.Question)
        self.setWindowTitle("Reload the model?")
        self.setText(f"{change} An answer is being written: stop it and reload now, or reload when it is finished?")
        self.setInformativeText("Loading takes a while; messages sent meanwhile wait for it.")
        self.choices = {
            self.STOP: self.addButton("Stop the answer and reload now", QMessageBox.ButtonRole.AcceptRole),
            self.WAIT: self.addButton("Reload when the answer is finished", QMessageBox.ButtonRole.AcceptRole),
            self.KEEP: self.addButton("Keep the current model", QMessageBox.ButtonRole.RejectRole),
        }
        self.setDefaultButton(self.choices[self.WAIT])
        self.setEscapeButton(self.choices[self.KEEP])
        self.setWindowModality(Qt.WindowModality.WindowModal)

    def choice(self) -> str | None:
        clicked = self.clickedButton()
        return next((key for key, button in self.choices.items() if button is clicked), None)
