"""API keys of remote engine profiles, in the OS keyring (no Qt here).

Why a keyring: settings.json is a plain file users copy, back up and attach to bug reports; a key
there leaks. `keyring` reaches the platform's store (Secret Service, macOS Keychain, Windows
Credential Locker). Where none works (a headless box, CI), the key is kept in this process's memory
for the session only and `problem` says so in one line — it is never written anywhere else.
"""

from __future__ import annotations

import keyring
import keyring.backend
import keyring.errors
from keyring.backends import fail

SERVICE = "phoenix-chat remote engine"  # the keyring entry's service; the username is the profile's name


class SecretStore:
    """get/set/delete one API key per remote profile name."""

    def __init__(self, backend: keyring.backend.KeyringBackend | None = None):
        """backend: a keyring backend to use (tests); None: the one keyring picks for this system."""
        self._backend: keyring.backend.KeyringBackend | None = backend or keyring.get_keyring()
        self._memory: dict[str, str] = {}  # the session-only keys when no keyring works
        self.problem: str | None = None  # one line for the user when keys cannot be stored
        if isinstance(self._backend, fail.Keyring):
            self._give_up("no system keyring is available")

    def _give_up(self, why: str) -> None:
        self._backend = None
        self.problem = f"API keys are kept for this session only: {why} (keyring found no working backend)."

    @property
    def persistent(self) -> bool:
        """Whether keys outlive the session (a keyring stores them)."""
        return self._backend is not None

    def get(self, profile: str) -> str | None:
        if profile in self._memory:
            return self._memory[profile]
        if self._backend is None:
            return None
        try:
            return self._backend.get_password(SERVICE, profile)
        except keyring.errors.KeyringError as exc:
            self._give_up(_one_line(exc))
            return None

    def set(self, profile: str, key: str | None) -> None:
        """Store `key` for `profile` (None or "": forget it)."""
        if not key:
            self.delete(profile)
            return
        if self._backend is not None:
            try:
                self._backend.set_password(SERVICE, profile, key)
                self._memory.pop(profile, None)
                return
            except keyring.errors.KeyringError as exc:
                self._give_up(_one_line(exc))
        self._memory[profile] = key

    def delete(self, profile: str) -> None:
        self._memory.pop(profile, None)
        if self._backend is None:
            return
        try:
            self._backend.delete_password(SERVICE, profile)
        except keyring.errors.PasswordDeleteError:
            pass  # there was none
        except keyring.errors.KeyringError as exc:
            self._give_up(_one_line(exc))

    def rename(self, old: str, new: str) -> None:
        """A profile renamed keeps its key."""
        if old == new:
            return
        key = self.get(old)
        self.delete(old)
        self.set(new, key)


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
