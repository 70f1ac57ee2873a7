"""The display name of a model read from a Hugging Face ``config.json``.

The name labels the model in every report and message, so it should say which model it is. In order:

1. a JSON file not named ``config.json``: its stem (``qwen3-0.6b.json`` -> ``qwen3-0.6b``): the user named it;
2. a ``config.json`` (or the directory holding it): the directory's name (``Llama-3.2-1B/``), resolved, so
   ``./config.json`` gives the current directory's name; except a Hugging Face cache snapshot, whose folder
   is a 40-hex-digit commit hash (``models--org--name/snapshots/<hash>/``): the repository's ``name`` then;
3. the config's ``_name_or_path`` (what ``from_pretrained`` was given): a hub id as it is
   (``meta-llama/Llama-3.2-1B``), a local path by its last component;
4. the config's ``model_type`` (``llama``);
5. ``custom``.
"""

from __future__ import annotations

import re
from pathlib import Path

_HASH = re.compile(r"[0-9a-f]{40}")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as huggingface_hub validates repo ids


def config_name(path: Path, doc: dict) -> str:
    """The name of the model whose ``config.json`` is ``path`` (a file) with contents ``doc`` (see above)."""
    if path.name != "config.json" and path.stem:
        return path.stem
    folder = path.resolve().parent
    if _HASH.fullmatch(folder.name) and folder.parent.name == "snapshots":
        repo = folder.parent.parent.name  # models--org--name
        if repo.startswith("models--"):
            return repo[len("models--"):].replace("--", "/")
    elif folder.name:
        return folder.name
    source = doc.get("_name_or_path")
    if isinstance(source, str) and source.strip():
        source = source.strip()
        return source if _HUB_ID.fullmatch(source) else (Path(source).name or source)
    model_type = doc.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else "custom"
