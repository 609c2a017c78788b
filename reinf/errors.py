"""One error type for the whole product.

A ``ReinfError`` carries a message written for the person, an optional fix, and
the HTTP status the web API answers with. The CLI turns it into a
``click.ClickException`` at one boundary (``ReinfGroup`` in reinf/cli/common.py); the web
app renders it as JSON.
"""
from __future__ import annotations


class ReinfError(Exception):
    status = 400

    def __init__(self, message: str, *, fix: str | None = None, status: int | None = None,
                 key: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.key = key
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return f"{self.message} — {self.fix}" if self.fix else self.message

    def to_dict(self) -> dict:
        out = {"error": self.message, "status": self.status}
        if self.fix:
            out["fix"] = self.fix
        if self.key:
            out["key"] = self.key
        return out


class ConfigError(ReinfError):
    """A setting is unknown, mistyped, out of range, or impossible with another."""


class BadInput(ReinfError):
    """A caller sent something we cannot accept (a score of 7, an empty message)."""


class NotFound(ReinfError):
    status = 404


class Conflict(ReinfError):
    status = 409


class StoreError(ReinfError):
    """The database cannot be opened, migrated or written."""
    status = 503


class ModelError(ReinfError):
    """The model cannot be loaded or run."""
    status = 503


class HookError(ReinfError):
    """The person's reward hook is broken; training refuses until it is fixed."""
    status = 409


class TrainingError(ReinfError):
    status = 409


class NotAvailable(ReinfError):
    """What this process or this machine cannot do: a server with no model loaded, no Reinf
    daemon at the given URL, a platform without a supported service manager."""
    status = 501
