"""Files from strangers: how the project reads and writes its kept files, reports and records (no torch).

Kept runs, reports and records arrive in pull requests, so every one of them is input from a stranger. The rules:

- **Data, never config.** `read_yaml` / `read_json` give plain values: YAML by the safe loader with no alias (an
  alias bomb is refused, not expanded), a file over `MAX_BYTES` refused unread, nesting that Python cannot parse
  refused, an integer of more than `MAX_DIGITS` digits refused; with `inert=False` (a run's saved config and
  overrides, the files that could reach Hydra or OmegaConf) a `${` anywhere is refused, so no interpolation of a
  kept file is ever resolved. Each problem is a `KeptFileError`, one line naming the file.
- **No link below a root.** `below` refuses a path that leaves its root (`..`) or passes through a symbolic link
  between the root and itself, the path itself included (the root itself may be a link: a user's `results/` on
  another disk). Reads open the file with `O_NOFOLLOW`; writes refuse a link at the path, then go through a
  temporary file in the same folder and a rename (`write_atomic`).
- **Names, not paths.** A path read from a file (a record's run folder, say) must be `plain_name`: one path part,
  not `.` or `..`.
- **Whole or absent.** `write_atomic` writes a temporary file, fsyncs it and renames it over the path: a reader,
  or a kill, sees the old file or the whole new one; a full disk or a read-only folder is one `StorageError` line.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import stat
import tempfile
from pathlib import Path

from highway_repro.errors import HighwayError, make_folder, storage_error, unwritable

MAX_BYTES = 64 * 2**20  # a kept YAML or JSON file larger than this is refused unread (the largest kept one: ~0.1 MB)
MAX_DIGITS = 30  # an integer in a kept JSON file with more digits is refused (a step or a count has at most 12)


class KeptFileError(HighwayError):
    """A kept file (a run folder's, a record, a report) that is not plain data of a sane size, is a symbolic link or
    lies outside its root: one line naming it (a run folder with one is a damaged run)."""


def _fix(path) -> str:
    return f"(valid: a plain file the project wrote, inside its folder; move {path} away or restore it from git)"


def below(path: Path, root: Path | None = None) -> Path:
    """`path`, once no part of it below `root` (default: its own folder) is a symbolic link and it does not leave
    `root`; KeptFileError otherwise. Parts that do not exist yet are fine (a file about to be written)."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    a, r = Path(os.path.normpath(path.absolute())), Path(os.path.normpath(root.absolute()))
    if a != r and r not in a.parents:
        raise KeptFileError(f"{path} lies outside {root} {_fix(path)}")
    part = r
    for name in a.relative_to(r).parts:
        part = part / name
        try:
            if stat.S_ISLNK(os.lstat(part).st_mode):
                raise KeptFileError(f"{part} is a symbolic link {_fix(part)}")
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise KeptFileError(f"{part} lies under a file {_fix(part)}") from None
    return path


def no_links(folder: Path, names) -> None:
    """KeptFileError where one of `names` in `folder` (a run folder about to be written: a received one, resumed)
    is a symbolic link: nothing is then written through it."""
    for name in names:
        below(Path(folder) / name, folder)


class LogFile(logging.FileHandler):
    """logging's FileHandler, opening its file without following a link at its path (a run folder's train.log,
    which Hydra opens before the job's own code runs: configs/train.yaml, hydra.job_logging)."""

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


def plain_name(value, what: str) -> str:
    """`value` where it is one plain path part (a record's run folder name, say), else KeptFileError naming it."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or "\0" in value:
        raise KeptFileError(f"{what}={value!r} is not allowed (valid: a plain folder or file name, no '/' or '..')")
    return value


def read_bytes(path: Path, root: Path | None = None, limit: int = MAX_BYTES) -> bytes | None:
    """The bytes of a kept file, None when it is absent; a link, a path outside `root`, a file that is not a plain
    one, larger than `limit` or that cannot be read is a KeptFileError."""
    fd = _open_kept(path, root, limit)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def check_kept(path: Path, root: Path | None = None, limit: int = MAX_BYTES) -> bool:
    """`read_bytes`' checks without reading the file: True where it is there and readable, False where absent."""
    fd = _open_kept(path, root, limit)
    if fd is not None:
        os.close(fd)
    return fd is not None


def _open_kept(path: Path, root: Path | None, limit: int) -> int | None:
    path = below(path, root)
    try:  # (O_NONBLOCK: a FIFO planted at the path does not hang the reader)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "is a symbolic link" if os.path.islink(path) else f"cannot be read ({e.strerror})"
        raise KeptFileError(f"{path} {why} {_fix(path)}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        why = "is not a plain file" if not stat.S_ISREG(st.st_mode) else \
            f"holds {st.st_size:,} bytes, more than a kept file may ({limit:,})"
        raise KeptFileError(f"{path} {why} {_fix(path)}")
    return fd


def _damaged(path, e: BaseException) -> KeptFileError:
    why = " ".join(str(e).split())[:160] if not isinstance(e, RecursionError) else "nested too deeply"
    return KeptFileError(f"{path} cannot be parsed ({type(e).__name__}: {why}) {_fix(path)}")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (valid: at most {MAX_DIGITS})")
    return int(text)


def parse_json(text: str | bytes, where) -> object:
    """One JSON document as plain values (`read_json`'s rules); `where` names it in the error. A string that is
    no text (a lone surrogate, `\\ud800`) is refused too: nothing could write it out again."""
    try:
        value = json.loads(text, parse_int=_int)
        if re.search(rb"\\u[dD][89a-fA-F]" if isinstance(text, bytes) else r"\\u[dD][89a-fA-F]", text):
            for s in _strings(value):
                s.encode()
        return value
    except (ValueError, RecursionError) as e:  # (UnicodeError is a ValueError)
        raise _damaged(where, e) from None


def read_json(path: Path, root: Path | None = None, kind: type | None = None):
    """A kept JSON file as plain values, None when absent; `kind` (dict, list): what the document must be."""
    blob = read_bytes(path, root)
    if blob is None:
        return None
    value = parse_json(blob, path)
    if kind is not None and not isinstance(value, kind):
        raise KeptFileError(f"{path} holds a JSON {type(value).__name__} (valid: a JSON {kind.__name__}) {_fix(path)}")
    return value


def _yaml_loader():
    import yaml

    class NoAliases(yaml.SafeLoader):
        """The safe loader, refusing every alias (`*a`): a kept file never repeats a node by reference."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, "an alias (valid: plain values, no aliases)", mark)
            return super().compose_node(parent, index)

    return yaml, NoAliases


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def read_yaml(path: Path, root: Path | None = None, inert: bool = True):
    """A kept YAML file as plain values (None when absent): the safe loader, no aliases; `inert=False`: a `${`
    (an interpolation, once handed to OmegaConf) is refused too. Text without `&` or `*` cannot hold an anchor or
    an alias and is read by libyaml's loader where PyYAML has it (~10x faster)."""
    yaml, loader = _yaml_loader()
    blob = read_bytes(path, root)
    if blob is None:
        return None
    try:
        text = blob.decode()
        if "&" not in text and "*" not in text:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        value = yaml.load(io.StringIO(text), Loader=loader)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:  # (a date of month 13, an
        raise _damaged(path, e) from None  # integer past Python's digit limit: values the loader cannot build)
    if not inert and any("${" in s for s in _strings(value)):
        raise KeptFileError(f"{path} holds an interpolation ('${{') (valid: plain values; a kept file is never "
                            f"resolved) {_fix(path)}")
    return value


def read_config(path: Path, root: Path | None = None) -> dict | None:
    """A run's `config_resolved.yaml` (None when absent): a mapping of plain values, no `${` (`read_yaml`, below
    `root`; default: the folder that holds the run folder)."""
    path = Path(path)
    cfg = read_yaml(path, root=root or path.parents[1], inert=False)
    if cfg is not None and not isinstance(cfg, dict):
        raise KeptFileError(f"{path} holds a {type(cfg).__name__} (valid: the mapping of a run's config)")
    return cfg


def write_atomic(path: Path, data: str | bytes, root: Path | None = None) -> Path:
    """Write `data` to `path` through a temporary file in its folder, fsync and a rename (`below(path, root)` first:
    no link on the way or at `path` itself). A write the user can fix (a full disk, a read-only folder, a file-size
    limit) is one StorageError line naming `path`."""
    path = below(path, root)
    blob = data.encode() if isinstance(data, str) else data
    tmp = None
    try:
        make_folder(path.parent)
        below(path, root)  # the folders just made, too
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        if unwritable(e) is not None:
            raise storage_error(unwritable(e), path) from None
        raise
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    return path


def copy_file(src: Path, dst: Path, src_root: Path | None = None, dst_root: Path | None = None) -> None:
    """Copy a kept file (`read_bytes` of `src`, `write_atomic` to `dst`) with its modification time; never through
    a link at either end."""
    blob = read_bytes(src, src_root)
    if blob is None:
        raise KeptFileError(f"{src} is gone {_fix(src)}")
    write_atomic(dst, blob, dst_root)
    st = os.stat(src, follow_symlinks=False)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
