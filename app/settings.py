"""Every user choice in one typed model, persisted as JSON in the data folder.

Defaults live in the dataclass and nowhere else; the sampling ones are the engine's own
(`engine.sampling.SamplingParams`), read from it, not restated. `SettingsModel.set(name, value)` writes the
file atomically (temp file + rename) and tells listeners `(name, value)`; no Qt here, the
controllers turn notifications into whatever they need.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from phoenix_chat.app.paths import data_dir
from phoenix_chat.app.server.config import DEFAULT_PORT
from phoenix_chat.engine.quantization import AS_IN_FILE, WeightQuant
from phoenix_chat.engine.remote.target import READ_TIMEOUT_RANGE_S, READ_TIMEOUT_S
from phoenix_chat.engine.sampling import SamplingParams

SETTINGS_VERSION = 2  # 2: quant is spelt as the engine's WeightQuant values (version 1 wrote "Q8_0")
SETTINGS_NAME = "settings.json"

QUANT_CHOICES = (AS_IN_FILE, *(q.value for q in WeightQuant))  # "file": as stored in the model file
NPU_CHOICES = ("off", "prefill")
CONTEXT_CHOICES = (None, 2048, 4096, 8192, 32768)  # None: auto, the largest the model and memory allow
PARALLEL_CHOICES = (1, 2, 4)  # Devices → Parallel answers: the engine's KV slots (chats answered at once)
OVERFLOW_CHOICES = ("drop_oldest", "truncate_middle")  # engine.prompt_fit.OVERFLOW_POLICIES
THEMES = ("light", "dark")
MAX_RECENT = 8
_ENGINE_SAMPLING = SamplingParams()


@dataclass
class Settings:
    model_path: str | None = None  # None: the embedded Gemma 3 270M
    draft_model: str | None = None  # Model → Draft model: speculative decoding with this file (None: off)
    recent_models: list[str] = field(default_factory=list)
    quant: str = AS_IN_FILE  # a QUANT_CHOICES value, handed to the engine as is
    backend: str = "auto"  # "auto" | "cpu" | "vulkan:<device index>"
    npu: str = "off"
    context_length: int | None = None  # auto
    context_overflow: str = "drop_oldest"  # what the model reads when a chat outgrows the context
    # chats answered at once: the model loads with this many KV slots (each a whole context of KV memory;
    # one loads where they do not fit); a chat sent beyond them waits its turn
    # 1: on the CPU reference a batched step of two rows costs ~3x a lone one, and each answer at
    # once holds a whole context of KV memory (an Auto context shrinks): the user opts in
    parallel_answers: int = 1
    theme: str = "light"
    show_device_panel: bool = True
    max_tokens: int = 512
    # Defaults for new conversations; each conversation keeps its own copy.
    system_prompt: str = ""
    temperature: float = _ENGINE_SAMPLING.temperature
    top_k: int = _ENGINE_SAMPLING.top_k
    top_p: float = _ENGINE_SAMPLING.top_p
    min_p: float = _ENGINE_SAMPLING.min_p
    repetition_penalty: float = _ENGINE_SAMPLING.repetition_penalty
    last_conversation_id: int | None = None
    window_geometry: str | None = None  # hex of QWidget.saveGeometry()
    # Settings → Pan-and-scan pictures: Gemma 3's crops of wide or tall pictures (this computer's engine)
    pan_and_scan: bool = False
    server_enabled: bool = False  # Server → Run local server: started at launch once the model loads
    server_port: int = DEFAULT_PORT  # on 127.0.0.1 (0: any free port)
    # Settings → Engine…: "local" (this computer) or "remote" (the profile named remote_profile)
    engine: str = "local"
    # saved remote servers: {name, url, model (None: the server's first), timeout_s (seconds to
    # wait for the server's next bytes)}; API keys are in the OS keyring (app/secrets.py), never here
    remote_profiles: list[dict] = field(default_factory=list)
    remote_profile: str | None = None

    def remote(self) -> dict | None:
        """The chosen remote profile (None: the local engine, or no such profile)."""
        if self.engine != "remote":
            return None
        return next((p for p in self.remote_profiles if p["name"] == self.remote_profile), None)

    def sampling_defaults(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "max_tokens": self.max_tokens,
        }


ENGINES = ("local", "remote")
PROFILE_FIELDS = ("name", "url", "model", "timeout_s")


def _is_profile(value: object) -> bool:
    """{name, url, model, timeout_s} and nothing else (an "api_key" field is refused: keys live in
    the keyring). timeout_s: seconds to wait for the server's next bytes (READ_TIMEOUT_RANGE_S)."""
    return (
        isinstance(value, dict)
        and set(value) == set(PROFILE_FIELDS)
        and isinstance(value["name"], str)
        and bool(value["name"].strip())
        and isinstance(value["url"], str)
        and bool(value["url"].strip())
        and (value["model"] is None or isinstance(value["model"], str))
        and _in_range(*READ_TIMEOUT_RANGE_S)(value["timeout_s"])
    )


def _profiles_with_timeouts(value: object) -> object:
    """Profiles saved before the read timeout was a setting get the default they ran with."""
    if not isinstance(value, list):
        return value
    return [{**p, "timeout_s": READ_TIMEOUT_S} if isinstance(p, dict) and "timeout_s" not in p else p for p in value]


def _profiles_ok(value: object) -> bool:
    if not isinstance(value, list) or not all(_is_profile(p) for p in value):
        return False
    names = [p["name"] for p in value]
    return len(names) == len(set(names))


def _quant_spelling(value: object) -> object:
    """ "Q8_0" (how version 1 wrote it) → "q8_0": one spelling, the engine's."""
    return value.lower() if isinstance(value, str) and value.lower() in QUANT_CHOICES else value


def _in_range(low: float, high: float) -> Callable[[object], bool]:
    """A check that a value is a number (not a bool) from `low` to `high`."""
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


# Applied to a value before it is checked, on `set` and on reading the file: old spellings migrate.
_NORMALIZERS: dict[str, Callable[[object], object]] = {
    "quant": _quant_spelling,
    "remote_profiles": _profiles_with_timeouts,
}

_VALIDATORS: dict[str, Callable[[object], bool]] = {
    "quant": lambda v: v in QUANT_CHOICES,
    "npu": lambda v: v in NPU_CHOICES,
    "context_overflow": lambda v: v in OVERFLOW_CHOICES,
    "theme": lambda v: v in THEMES,
    "backend": lambda v: isinstance(v, str) and (v in ("auto", "cpu") or v.startswith("vulkan")),
    "context_length": lambda v: v is None or (isinstance(v, int) and v > 0),
    "parallel_answers": lambda v: v in PARALLEL_CHOICES and not isinstance(v, bool),
    "max_tokens": lambda v: isinstance(v, int) and v > 0,
    # the defaults for new chats (Settings → Defaults for new chats…): a bad hand edit is ignored
    "system_prompt": lambda v: isinstance(v, str),
    "temperature": _in_range(0.0, 2.0),
    "top_k": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "top_p": _in_range(0.0, 1.0),
    "min_p": _in_range(0.0, 1.0),
    "repetition_penalty": _in_range(1.0, 2.0),
    "draft_model": lambda v: v is None or isinstance(v, str),
    "pan_and_scan": lambda v: isinstance(v, bool),
    "server_enabled": lambda v: isinstance(v, bool),
    "server_port": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535,
    "engine": lambda v: v in ENGINES,
    "remote_profiles": _profiles_ok,
    "remote_profile": lambda v: v is None or isinstance(v, str),
}


class SettingsModel:
    """The live settings: read `model.values.<name>`, change with `set`, listen with `subscribe`."""

    def __init__(self, home=None):
        self.path = data_dir(home) / SETTINGS_NAME
        self.values = _load(self.path)
        self._listeners: list[Callable[[str, object], None]] = []

    def subscribe(self, listener: Callable[[str, object], None]) -> None:
        self._listeners.append(listener)

    def set(self, name: str, value) -> None:
        if name not in {f.name for f in fields(Settings)}:
            raise KeyError(name)
        value = _NORMALIZERS.get(name, lambda v: v)(value)
        check = _VALIDATORS.get(name)
        if check and not check(value):
            raise ValueError(f"bad value for {name}: {value!r}")
        if getattr(self.values, name) == value:
            return
        setattr(self.values, name, value)
        self.save()
        for listener in list(self._listeners):
            listener(name, value)

    def set_new_chat_defaults(self, system_prompt: str, sampling: dict) -> None:
        """The system prompt and `sampling_defaults()` fields a new chat starts with (chats
        already made keep their own copy). All are checked before any is stored."""
        values = {"system_prompt": system_prompt, **sampling}
        unknown = set(values) - {"system_prompt", *self.values.sampling_defaults()}
        if unknown:
            raise KeyError(", ".join(sorted(unknown)))
        for name, value in values.items():
            check = _VALIDATORS.get(name)
            if check and not check(value):
                raise ValueError(f"bad value for {name}: {value!r}")
        for name, value in values.items():
            self.set(name, value)

    def add_recent_model(self, path: str) -> None:
        recent = [path] + [p for p in self.values.recent_models if p != path]
        self.set("recent_models", recent[:MAX_RECENT])

    def remove_recent_model(self, path: str) -> None:
        self.set("recent_models", [p for p in self.values.recent_models if p != path])

    def save_remote_profile(self, profile: dict, *, replacing: str | None = None) -> None:
        """Add `profile` ({name, url, model, timeout_s}; timeout_s may be left out: the default),
        or put it in place of the one named `replacing` (or of its own name); a profile with a key
        field is refused (ValueError)."""
        profile = {"timeout_s": READ_TIMEOUT_S, **profile}
        if not _is_profile(profile):
            raise ValueError(f"bad remote profile: fields must be {', '.join(PROFILE_FIELDS)}")
        old = {replacing, profile["name"]}
        kept = [p for p in self.values.remote_profiles if p["name"] not in old]
        at = next((i for i, p in enumerate(self.values.remote_profiles) if p["name"] in old), len(kept))
        self.set("remote_profiles", [*kept[:at], dict(profile), *kept[at:]])

    def remove_remote_profile(self, name: str) -> None:
        self.set("remote_profiles", [p for p in self.values.remote_profiles if p["name"] != name])
        if self.values.remote_profile == name:
            self.set("engine", "local")
            self.set("remote_profile", None)

    def save(self) -> None:
        data = {"version": SETTINGS_VERSION, **asdict(self.values)}
        fd, tmp = tempfile.mkstemp(prefix=".settings-", dir=self.path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)


def _load(path: Path) -> Settings:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Settings()
    settings = Settings()
    for f in fields(Settings):
        if f.name in data:
            value = _NORMALIZERS.get(f.name, lambda v: v)(data[f.name])
            check = _VALIDATORS.get(f.name)
            if check is None or check(value):
                setattr(settings, f.name, value)
    return settings
