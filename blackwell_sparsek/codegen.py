"""Render a validated config into CUDA source through a thin Jinja2 template.

Every template variable must be supplied: the environment uses ``StrictUndefined``, so a placeholder the config
does not fill is an error, never an empty string in the generated code. Rendering writes nothing; ``generate``
writes only to the path it is given.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from ._paths import templates_dir
from .config import KernelConfig
from .errors import BskError

_RESERVED = ("kernel_name", "config_json", "package_version", "abi")


@lru_cache(maxsize=None)
def _environment(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def environment() -> jinja2.Environment:
    """The Jinja2 environment over the package's templates directory (StrictUndefined)."""
    return _environment(str(templates_dir()))


def template_context(config: KernelConfig) -> dict[str, Any]:
    """Everything a family's template may use: the config's own variables plus naming and ABI facts."""
    from . import __version__
    tvars = config.template_vars()
    clash = sorted(set(tvars) & set(_RESERVED))
    if clash:
        raise BskError(f"{type(config).__name__}.template_vars() must not define {clash}: codegen sets them")
    return {
        **tvars,
        "kernel_name": config.kernel_name,
        "config_json": config.to_json(),
        "package_version": __version__,
        "abi": [tuple(field) for field in config.abi],
    }


def render(config: KernelConfig) -> str:
    """Validate ``config`` and return the CUDA source of its kernel."""
    config.validate()
    try:
        template = environment().get_template(config.template)
        return template.render(**template_context(config))
    except jinja2.UndefinedError as e:
        raise BskError(f"template {config.template} uses a variable the {config.family} config does not "
                       f"provide ({e.message}); add it to {type(config).__name__}.template_vars()") from e
    except jinja2.TemplateNotFound as e:
        raise BskError(f"template {e.name!r} not found in {templates_dir()}") from e
    except jinja2.TemplateSyntaxError as e:
        raise BskError(f"template {e.filename or config.template}:{e.lineno}: {e.message}") from e


def generate(config: KernelConfig, out_path: str | os.PathLike[str]) -> Path:
    """Render ``config`` and write the source to ``out_path`` (parents created); returns the path."""
    source = render(config)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(source)
    os.replace(tmp, out)
    return out
