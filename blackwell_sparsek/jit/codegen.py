"""Render a validated config into CUDA source through a thin Jinja2 template.

Every template variable must be supplied: the environment uses ``StrictUndefined``, so a placeholder the config
does not fill is an error, never an empty string in the generated code. Rendering writes nothing; ``generate``
writes only to the path it is given (or ``<dir>/<kernel_name>.cu`` for a directory) and never leaves a partial or
temporary file behind.
"""
from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jinja2

from .._paths import templates_dir
from .spec import KernelConfig, resolve_config
from ..errors import BskError, InputError

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
    from .. import __version__
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


def render(config: KernelConfig | str | Mapping[str, Any]) -> str:
    """Validate ``config`` and return the CUDA source of its kernel. ``config`` is anything
    :func:`~blackwell_sparsek.jit.spec.resolve_config` takes: a config, a dict, inline JSON, a .json path or a name."""
    config = resolve_config(config)
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


def output_path(config: KernelConfig, out_path: str | os.PathLike[str]) -> Path:
    """Where ``generate`` writes: ``out_path`` itself, or ``<out_path>/<kernel_name>.cu`` when it is an existing
    directory or ends with a path separator (like ``cp``)."""
    if not isinstance(out_path, (str, os.PathLike)) or not isinstance(os.fspath(out_path), str):
        raise InputError(f"the output path must be a str or os.PathLike (a .cu file or a directory), "
                         f"got {type(out_path).__name__}")
    text = os.fspath(out_path)
    if not text or "\0" in text:
        raise InputError(f"output path {text!r} is not a usable path; give a .cu file or a directory")
    out = Path(text)
    try:
        is_dir = out.is_dir()
    except OSError:  # e.g. a name too long: the write below reports it
        is_dir = False
    if is_dir or text.endswith(os.sep) or (os.altsep is not None and text.endswith(os.altsep)):
        out = out / f"{config.kernel_name}.cu"
    return out


def _write_error(out: Path, e: OSError) -> InputError:
    # Name the component in the way when a parent "directory" is a file (-o file/x.cu).
    for parent in out.parents:
        try:
            if not parent.exists():
                continue
            if not parent.is_dir():
                return InputError(f"cannot write {out}: {parent} is a file, not a directory; choose another "
                                  f"output path")
        except OSError:
            pass
        break
    return InputError(f"cannot write {out}: {e.strerror or e}; choose an output path in a directory you can "
                      f"write to")


def write_text_atomic(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` through a temporary file in the same directory and ``os.replace``: a reader never
    sees half a file, and the temporary file is removed whatever fails (it is created exclusively, so a file or
    link someone planted under that name is never followed or overwritten)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _write_error(out, e) from None
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    created = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        created = True
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
        created = False
    except OSError as e:
        raise _write_error(out, e) from None
    finally:
        if created:  # any failure, KeyboardInterrupt included
            try:
                os.unlink(tmp)
            except OSError:
                pass


def generate(config: KernelConfig | str | Mapping[str, Any], out_path: str | os.PathLike[str]) -> Path:
    """Render ``config`` (anything ``resolve_config`` takes) and write the source to ``out_path``: a file path
    (parents created), or an existing directory / a path ending in a separator, which gets
    ``<kernel_name>.cu``. Returns the path written; a failure leaves no file behind."""
    cfg = resolve_config(config)
    source = render(cfg)
    out = output_path(cfg, out_path)
    write_text_atomic(out, source)
    return out
