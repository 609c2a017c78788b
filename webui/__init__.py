"""Reinf's web UI and HTTP API (Flask). ``create_app`` is the application factory."""
from webui.app import create_app

__all__ = ["create_app"]
