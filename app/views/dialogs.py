"""Small dialogs: per-conversation chat settings. Layout only."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)


class ChatSettingsDialog(QDialog):
    """System prompt and sampling settings for one conversation.

    `sampling` has every field of `values()` (the controller merges the settings' defaults
    with the conversation's own): the dialog shows what it is given and has no defaults."""

    def __init__(self, system_prompt: str, sampling: dict, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
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
