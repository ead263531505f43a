"""Settings → Engine…: answer on this computer, or through a remote OpenAI-compatible server
(vLLM, llama.cpp's server, Ollama, another Phoenix Chat). Layout only: EngineController fills it,
tests the connection and applies the choice."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from phoenix_chat.engine.remote.target import READ_TIMEOUT_RANGE_S, READ_TIMEOUT_S

NEW_PROFILE = ""  # the profiles combo's data for "New server…"


class EngineDialog(QDialog):
    test_requested = Signal()  # Test connection: the controller asks the server and calls set_status
    profile_chosen = Signal(str)  # a saved profile's name was picked (NEW_PROFILE: a new one)
    delete_requested = Signal(str)  # Delete: forget this saved profile (and its key)

    def __init__(self, profiles: list[str], parent=None, *, key_note: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Engine")
        self.setObjectName("engineDialog")
        self.local_radio = QRadioButton("This computer (the model you open; Devices and Model menus)")
        self.remote_radio = QRadioButton("Remote server (OpenAI-compatible API)")
        self._kind = QButtonGroup(self)
        self._kind.addButton(self.local_radio)
        self._kind.addButton(self.remote_radio)
        self.local_radio.setChecked(True)

        self.profiles = QComboBox()
        self.profiles.setObjectName("engineProfiles")
        self.delete_button = QPushButton("Delete")
        self.name = QLineEdit(placeholderText="e.g. workstation")
        self.url = QLineEdit(placeholderText="http://192.168.1.20:8000/v1")
        self.api_key = QLineEdit(placeholderText="empty if the server needs none")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.model = QComboBox(editable=True)
        self.model.setObjectName("engineModel")
        line = self.model.lineEdit()
        if line is not None:
            line.setPlaceholderText("the server’s first model")
        self.timeout = QSpinBox(suffix=" s")
        self.timeout.setObjectName("engineTimeout")
        self.timeout.setRange(*(int(s) for s in READ_TIMEOUT_RANGE_S))
        self.timeout.setValue(int(READ_TIMEOUT_S))
        self.timeout.setToolTip(
            "How long to wait for the server's next words before calling the answer cut. The first "
            "ones come only after the server has read the whole chat: raise this for a server that "
            "reads long prompts slowly (one running on a CPU, a very long chat)."
        )
        self.test_button = QPushButton("Test connection")
        self.status = QLabel(wordWrap=True)
        self.status.setObjectName("engineStatus")
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.key_note = QLabel(key_note, wordWrap=True)
        self.key_note.setObjectName("engineKeyNote")
        self.key_note.setVisible(bool(key_note))

        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(self.profiles, 1)
        h.addWidget(self.delete_button)
        self.remote_box = QWidget()
        form = QFormLayout(self.remote_box)
        form.addRow("Saved servers", row)
        form.addRow("Name", self.name)
        form.addRow("URL", self.url)
        form.addRow("API key", self.api_key)
        form.addRow("Model", self.model)
        form.addRow("Wait for replies up to", self.timeout)
        form.addRow("", self.test_button)
        form.addRow("", self.status)
        form.addRow("", self.key_note)
        note = QLabel(
            "Chats, history and sampling settings stay here; a remote server has its own devices and "
            "quantization, so those menus apply to this computer only.",
            wordWrap=True,
        )
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.local_radio)
        layout.addWidget(self.remote_radio)
        layout.addWidget(self.remote_box)
        layout.addWidget(note)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(520)

        self.set_profiles(profiles, None)
        self.remote_radio.toggled.connect(self._sync)
        self.test_button.clicked.connect(self.test_requested)
        self.profiles.activated.connect(lambda _i: self.profile_chosen.emit(self.profiles.currentData() or NEW_PROFILE))
        self.delete_button.clicked.connect(lambda: self.delete_requested.emit(self.profiles.currentData() or ""))
        self._sync()

    def set_profiles(self, names: list[str], current: str | None) -> None:
        self.profiles.clear()
        for name in names:
            self.profiles.addItem(name, name)
        self.profiles.addItem("New server…", NEW_PROFILE)
        self.profiles.setCurrentIndex(max(self.profiles.findData(current or NEW_PROFILE), 0))
        self._sync()

    def set_remote(self, remote: bool) -> None:
        (self.remote_radio if remote else self.local_radio).setChecked(True)

    def show_profile(self, profile: dict | None, api_key: str | None) -> None:
        """Fill the fields with a saved profile (None: empty, for a new one)."""
        profile = profile or {"name": "", "url": "", "model": None, "timeout_s": READ_TIMEOUT_S}
        self.name.setText(profile["name"])
        self.url.setText(profile["url"])
        self.timeout.setValue(round(profile["timeout_s"]))
        self.api_key.setText(api_key or "")
        self.set_models([], profile["model"])
        self.status.clear()
        self._sync()

    def set_models(self, models: list[str], current: str | None) -> None:
        """The server's /v1/models ids; `current` stays selected (typed in if the list lacks it)."""
        self.model.clear()
        self.model.addItems(models)
        if current:
            index = self.model.findText(current)
            if index < 0:
                self.model.addItem(current)
                index = self.model.count() - 1
            self.model.setCurrentIndex(index)
        elif models:
            self.model.setCurrentIndex(0)

    def set_status(self, text: str, ok: bool) -> None:
        self.status.setText(text)
        self.status.setProperty("ok", ok)

    def set_testing(self, testing: bool) -> None:
        self.test_button.setEnabled(not testing)
        if testing:
            self.status.setText("Connecting…")

    def remote_chosen(self) -> bool:
        return self.remote_radio.isChecked()

    def profile(self) -> dict:
        """The remote fields as a profile ({name, url, model, timeout_s}); the key is read apart."""
        model = self.model.currentText().strip()
        url = self.url.text().strip()
        name = self.name.text().strip() or _default_name(url)
        return {"name": name, "url": url, "model": model or None, "timeout_s": float(self.timeout.value())}

    def editing(self) -> str | None:
        """The saved profile the fields came from (None: a new one)."""
        return self.profiles.currentData() or None

    def _sync(self) -> None:
        remote = self.remote_radio.isChecked()
        self.remote_box.setEnabled(remote)
        self.delete_button.setEnabled(remote and bool(self.profiles.currentData()))


def _default_name(url: str) -> str:
    """A profile saved without a name is called after its host."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0] or "server"
