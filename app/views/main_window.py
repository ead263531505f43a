"""The main window: menus, conversation list, chat pane, device dock, status bar. Layout only.

Every menu action is an attribute so controllers (and tests) can reach it; the window
itself never talks to the worker or the store.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QProgressBar, QPushButton, QSplitter

from phoenix_chat.app.settings import CONTEXT_CHOICES, OVERFLOW_CHOICES, PARALLEL_CHOICES, QUANT_CHOICES
from phoenix_chat.app.views.chat_view import ChatView
from phoenix_chat.app.views.conversation_list import ConversationListView
from phoenix_chat.app.views.elided_label import ElidedLabel
from phoenix_chat.app.views.gauges_view import DevicePanel
from phoenix_chat.engine.quantization import AS_IN_FILE, WeightQuant

APP_TITLE = "Phoenix Chat"
QUANT_LABELS = {AS_IN_FILE: "As in file", **{q.value: q.label for q in WeightQuant}}
AUTO_CONTEXT_LABEL = "Auto (the largest that fits)"
OVERFLOW_LABELS = {"drop_oldest": "Drop the oldest messages", "truncate_middle": "Truncate the middle"}


class MainWindow(QMainWindow):
    closing = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle(APP_TITLE)
        self.resize(1240, 780)

        self.conversations = ConversationListView()
        self.chat = ChatView()
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.conversations)
        splitter.addWidget(self.chat)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([230, 760])
        splitter.setChildrenCollapsible(False)
        self.setCentralWidget(splitter)

        self.devices = DevicePanel()
        self.device_dock = QDockWidget("Devices", self)
        self.device_dock.setObjectName("deviceDock")
        self.device_dock.setWidget(self.devices)
        feature = QDockWidget.DockWidgetFeature
        self.device_dock.setFeatures(feature.DockWidgetClosable | feature.DockWidgetMovable)
        self.device_dock.setMinimumWidth(250)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.device_dock)

        self._build_status_bar()
        self._build_menus()

    # -- status bar -----------------------------------------------------------------------
    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.model_label = ElidedLabel("No model", Qt.TextElideMode.ElideRight)
        self.model_label.setObjectName("modelLabel")
        # The load step has a label of its own (elided, whole in the tooltip): inside the
        # bar a step such as "dequantizing layers.17.post_feedforward_layernorm" was cut.
        self.load_message = ElidedLabel()
        self.load_message.setObjectName("loadMessage")
        self.load_message.setMaximumWidth(320)
        self.load_progress = QProgressBar(maximum=1000)
        self.load_progress.setObjectName("loadProgress")
        self.load_progress.setMaximumWidth(120)
        self.load_progress.setTextVisible(True)
        self.load_progress.setFormat("%p%")
        self.load_cancel = QPushButton("Cancel", flat=True)
        self.load_cancel.setObjectName("loadCancel")
        self.tps_label = QLabel("— tok/s")
        self.tps_label.setObjectName("tpsLabel")
        self.ttft_label = QLabel("TTFT —")
        self.ttft_label.setObjectName("ttftLabel")
        self.context_label = QLabel("context —")
        self.context_label.setObjectName("contextLabel")
        self.draft_label = QLabel("")  # speculative decoding: acceptance and speed-up
        self.draft_label.setObjectName("draftLabel")
        self.server_label = QLabel("")  # the local server: its URL and active requests, or its error
        self.server_label.setObjectName("serverLabel")
        bar.addWidget(self.model_label, 1)
        bar.addPermanentWidget(self.load_message)
        bar.addPermanentWidget(self.load_progress)
        bar.addPermanentWidget(self.load_cancel)
        for w in (self.server_label, self.tps_label, self.draft_label, self.ttft_label, self.context_label):
            bar.addPermanentWidget(w)
        self.show_loading(None)

    def show_loading(self, fraction: float | None, message: str = "") -> None:
        """Progress of a model load (None hides the bar)."""
        visible = fraction is not None
        for w in (self.load_message, self.load_progress, self.load_cancel):
            w.setVisible(visible)
        if fraction is not None:
            self.load_progress.setValue(int(fraction * 1000))
            self.load_message.setText(message)

    # -- menus ----------------------------------------------------------------------------
    def _build_menus(self) -> None:
        mb = self.menuBar()
        file_menu = mb.addMenu("&File")
        self.open_file_action = file_menu.addAction("Open GGUF file…")
        self.open_file_action.setShortcut(QKeySequence.StandardKey.Open)
        self.open_folder_action = file_menu.addAction("Open Hugging Face folder…")
        self.embedded_action = file_menu.addAction("Use the embedded model (Gemma 3 270M)")
        self.recent_menu = file_menu.addMenu("Recent models")
        file_menu.addSeparator()
        self.new_chat_action = file_menu.addAction("New chat")
        self.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        export_menu = file_menu.addMenu("Export conversation")
        self.export_markdown_action = export_menu.addAction("As Markdown…")
        self.export_json_action = export_menu.addAction("As JSON…")
        file_menu.addSeparator()
        self.quit_action = file_menu.addAction("Quit")
        self.quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)

        model_menu = mb.addMenu("&Model")
        quant_menu = model_menu.addMenu("Quantization")
        self.quant_group = QActionGroup(self)
        self.quant_actions: dict[str, QAction] = {}
        for q in QUANT_CHOICES:
            a = quant_menu.addAction(QUANT_LABELS[q])
            a.setCheckable(True)
            a.setData(q)
            self.quant_group.addAction(a)
            self.quant_actions[q] = a
        self.draft_menu = model_menu.addMenu("Draft model")
        self.draft_menu.setToolTipsVisible(True)
        self.draft_group = QActionGroup(self)
        self.draft_none_action = self.draft_menu.addAction("None")
        self.draft_none_action.setCheckable(True)
        self.draft_group.addAction(self.draft_none_action)
        self.draft_actions: dict[str, QAction] = {}
        self._draft_end = self.draft_menu.addSeparator()  # the candidates go above it
        self.draft_open_action = self.draft_menu.addAction("Open…")
        model_menu.addSeparator()
        self.reload_action = model_menu.addAction("Reload model")
        self.model_info_action = model_menu.addAction("About this model…")

        dev_menu = mb.addMenu("&Devices")
        self.backend_menu = dev_menu.addMenu("Backend")
        self.backend_group = QActionGroup(self)
        self.backend_actions: dict[str, QAction] = {}
        self.set_backend_choices([("auto", "Auto"), ("cpu", "CPU")])
        self.npu_menu = dev_menu.addMenu("NPU")
        self.npu_group = QActionGroup(self)
        self.npu_actions: dict[str, QAction] = {}
        for key, label in (("off", "Off"), ("prefill", "Prefill on NPU")):
            a = self.npu_menu.addAction(label)
            a.setCheckable(True)
            a.setData(key)
            self.npu_group.addAction(a)
            self.npu_actions[key] = a
        self.npu_reason_action = self.npu_menu.addAction("")
        self.npu_reason_action.setEnabled(False)
        self.npu_reason_action.setVisible(False)
        ctx_menu = dev_menu.addMenu("Context length")
        self.context_group = QActionGroup(self)
        self.context_actions: dict[int | None, QAction] = {}
        for n in CONTEXT_CHOICES:
            a = ctx_menu.addAction(AUTO_CONTEXT_LABEL if n is None else f"{n:,} tokens")
            a.setCheckable(True)
            a.setData(0 if n is None else n)
            self.context_group.addAction(a)
            self.context_actions[n] = a
        ctx_menu.addSeparator()
        ctx_menu.addAction("When a chat is longer than the context:").setEnabled(False)
        self.overflow_group = QActionGroup(self)
        self.overflow_actions: dict[str, QAction] = {}
        for key in OVERFLOW_CHOICES:
            a = ctx_menu.addAction(OVERFLOW_LABELS[key])
            a.setCheckable(True)
            a.setData(key)
            self.overflow_group.addAction(a)
            self.overflow_actions[key] = a
        parallel_menu = dev_menu.addMenu("Parallel answers")
        parallel_menu.setToolTipsVisible(True)
        self.parallel_group = QActionGroup(self)
        self.parallel_actions: dict[int, QAction] = {}
        for n in PARALLEL_CHOICES:
            a = parallel_menu.addAction("1 (one chat answers at a time)" if n == 1 else f"{n} chats at once")
            a.setCheckable(True)
            a.setData(n)
            a.setToolTip(
                "Each answer at once holds its own KV cache (a whole context of memory); on a GPU they "
                "share each pass over the weights, on the CPU backend they are slower than one at a time"
            )
            self.parallel_group.addAction(a)
            self.parallel_actions[n] = a

        view_menu = mb.addMenu("&View")
        self.device_panel_action = self.device_dock.toggleViewAction()
        self.device_panel_action.setText("Device panel")
        view_menu.addAction(self.device_panel_action)
        theme_menu = view_menu.addMenu("Theme")
        self.theme_group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for key, label in (("light", "Light"), ("dark", "Dark")):
            a = theme_menu.addAction(label)
            a.setCheckable(True)
            a.setData(key)
            self.theme_group.addAction(a)
            self.theme_actions[key] = a

        server_menu = mb.addMenu("Se&rver")
        self.server_action = server_menu.addAction("Run local server (OpenAI API)")
        self.server_action.setCheckable(True)
        self.copy_url_action = server_menu.addAction("Copy URL")
        self.copy_url_action.setEnabled(False)

        settings_menu = mb.addMenu("&Settings")
        self.defaults_action = settings_menu.addAction("Defaults for new chats…")
        self.defaults_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.engine_action = settings_menu.addAction("Engine… (this computer or a remote server)")
        settings_menu.setToolTipsVisible(True)
        self.pan_and_scan_action = settings_menu.addAction("Pan-and-scan pictures (crops of wide or tall ones too)")
        self.pan_and_scan_action.setCheckable(True)
        self.pan_and_scan_action.setToolTip(
            "Gemma 3's pan-and-scan: a picture much wider than tall (or taller than wide) is also given "
            "to the model as 2 to 4 crops: finer detail, more prompt tokens (this computer's engine)"
        )

        help_menu = mb.addMenu("&Help")
        self.diagnostics_action = help_menu.addAction("Diagnostics…")  # DiagnosticsController

    def set_auto_context(self, tokens: int | None) -> None:
        """Show what "Auto" came to for the loaded model (None: not known yet)."""
        label = AUTO_CONTEXT_LABEL if tokens is None else f"Auto — {tokens:,} tokens (the largest that fits)"
        self.context_actions[None].setText(label)

    def set_draft_choices(self, choices: list[tuple[str, str]], current: str | None) -> list[QAction]:
        """(path, label) per model that could draft for the loaded one; `current`: the draft in use."""
        for a in self.draft_actions.values():
            self.draft_group.removeAction(a)
            self.draft_menu.removeAction(a)
        self.draft_actions = {}
        if current is not None and current not in dict(choices):
            choices = [*choices, (current, current)]  # opened with Open…: shown while in use
        for path, label in choices:
            a = QAction(label, self.draft_menu, checkable=True)
            a.setData(path)
            a.setToolTip(path)
            self.draft_menu.insertAction(self._draft_end, a)
            self.draft_group.addAction(a)
            self.draft_actions[path] = a
        self.draft_actions.get(current or "", self.draft_none_action).setChecked(True)
        return list(self.draft_actions.values())

    def set_backend_choices(self, choices: list[tuple[str, str]]) -> None:
        """(id, label) per backend entry: Auto, each Vulkan device by name, CPU."""
        checked = self.backend_group.checkedAction()
        current = checked.data() if checked else None
        for a in list(self.backend_actions.values()):
            self.backend_group.removeAction(a)
            self.backend_menu.removeAction(a)
        self.backend_actions = {}
        for key, label in choices:
            a = self.backend_menu.addAction(label)
            a.setCheckable(True)
            a.setData(key)
            self.backend_group.addAction(a)
            self.backend_actions[key] = a
        if current in self.backend_actions:
            self.backend_actions[current].setChecked(True)

    def set_npu_available(self, present: bool, reason: str = "") -> None:
        self.npu_actions["prefill"].setEnabled(present)
        text = "" if present else f"Not available: {reason or 'no NPU found'}"
        self.npu_reason_action.setText(text)
        self.npu_reason_action.setVisible(not present)
        self.npu_actions["prefill"].setToolTip(text)
        self.npu_menu.setToolTipsVisible(True)

    def set_recent_models(self, paths: list[str]) -> list[QAction]:
        self.recent_menu.clear()
        actions = []
        for p in paths:
            a = self.recent_menu.addAction(p)
            a.setData(p)
            actions.append(a)
        self.recent_menu.setEnabled(bool(paths))
        return actions

    def closeEvent(self, event) -> None:  # noqa: N802
        self.closing.emit()
        super().closeEvent(event)
