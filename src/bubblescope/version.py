"""The version of bubblescope, as ``pyproject.toml`` declares it; written into every result document.

It lives apart from ``bubblescope/__init__.py`` so that modules can read it without importing the package's
face, which re-exports the main job (:func:`bubblescope.diagnose`) from :mod:`bubblescope.diagnosis`.
"""

__version__ = "0.1.0"
