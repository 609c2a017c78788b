"""Where the model lives: ``model_path`` resolved to what ``from_pretrained`` reads.

``model_path`` is a named model (``reinf models``: ``reinf-demo`` is built in, the others
are pulled into ``<data_dir>/models``), a local directory, or a hub id. Nothing here
imports torch: ``reinf status`` and the memory plan resolve the model without loading it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reinf.models import DEMO, KNOWN_MODELS, pulled_dir

if TYPE_CHECKING:  # for the annotations only: reinf.config imports this module
    from reinf.config import Config

# The repository (or install) root: the directory that holds reinf/, webui/, models/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = DEMO.name      # "reinf-demo"


def model_display_name(source: str) -> str:
    """The model's name as clients see it (a turn's ``model`` in /api/chat and ``chat
    --json``, /api/ping, /v1/models): a named model (reinf-demo, smollm2-135m) or a hub id
    as it is, a local directory by its own name. Never the path: that would tell every
    client where the person keeps their files, and change when they move them."""
    value = source.rstrip("/\\")
    local = value.startswith((".", "~", "/")) or "\\" in value or value.count("/") > 1 \
        or Path(value).expanduser().exists()
    return value.replace("\\", "/").rsplit("/", 1)[-1] if local else value


def demo_model_dir(cfg: Config) -> Path:
    """The built-in demo model: the checkout's models/reinf-demo, else one built in data_dir."""
    bundled = PROJECT_ROOT / "models" / DEMO_MODEL
    if (bundled / "config.json").exists():
        return bundled
    return cfg.data_dir / "models" / DEMO_MODEL


def resolve_model_path(cfg: Config) -> str:
    """``model_path`` as from_pretrained should see it: an absolute directory or a hub id.

    ``reinf-demo`` is the built-in demo model. A relative path is looked up from the
    current directory, then beside the config file. Anything else that does not exist
    locally and does not look like a path is taken as a hub id.
    """
    value = cfg.model.model_path
    if value == DEMO_MODEL:
        return str(demo_model_dir(cfg))
    if value in KNOWN_MODELS:  # a named model: `reinf pull NAME` put it here
        return str(pulled_dir(cfg.data_dir, value))
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    if cfg.source:
        beside = Path(cfg.source).expanduser().parent / path
        if beside.exists():
            return str(beside.resolve())
    if value.startswith((".", "~", "/")) or value.count("/") > 1 or "\\" in value:
        return str(path.resolve())  # meant as a path; the loader reports it missing
    return value
