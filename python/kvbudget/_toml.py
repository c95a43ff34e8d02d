"""A TOML writer for run()'s dict configs (Python's tomllib only reads): tables,
arrays of tables ([[strategy]]), strings, numbers, booleans and arrays of them; NumPy
scalars and arrays, other numbers.Integral / numbers.Real and os.PathLike paths are
written as the Python values they stand for."""

import math
import numbers
import os


def _plain(v):
    """v as a Python value TOML can write: NumPy scalars (and 0-d arrays, torch scalars)
    through .item(), arrays through .tolist(), other numbers.Integral / numbers.Real as
    int / float, os.PathLike as its path string; anything else as it is."""
    if isinstance(v, (bool, int, float, str, list, tuple, dict)):
        return v
    if hasattr(v, "item") and getattr(v, "shape", None) == ():  # np.generic, a 0-d array
        return v.item()
    if hasattr(v, "tolist") and hasattr(v, "dtype"):  # an array: a TOML array
        return v.tolist()
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return v


# TOML basic strings' short escapes; other control characters (U+0000-U+001F, U+007F)
# are written as \uXXXX, every other character as itself (UTF-8).
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s):
    """s as a TOML basic string. Characters beyond U+FFFF are written as themselves (JSON
    would write them as surrogate pairs, which TOML forbids)."""
    def escaped(c):
        if c in _SHORT_ESCAPES:
            return _SHORT_ESCAPES[c]
        if c < " " or c == "\x7f":
            return f"\\u{ord(c):04x}"
        return c

    return '"' + "".join(escaped(c) for c in s) + '"'


def _value(v, where):
    v = _plain(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x, where + '.' + str(k))}" for k, x in v.items()) + "}"
    raise TypeError(f"config {where}: a {type(v).__name__} has no TOML form")


def _key(k):
    """k as a TOML key: bare when ASCII letters, digits, - and _ (TOML's bare keys), else quoted."""
    k = str(k)
    return k if k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k) else _string(k)


def _is_table_array(v):
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _table(d, path, out):
    # Plain keys first, then sub-tables and arrays of tables (TOML's order).
    d = {k: _plain(v) for k, v in d.items()}
    for k, v in d.items():
        if not isinstance(v, dict) and not _is_table_array(v):
            out.append(f"{_key(k)} = {_value(v, path + str(k))}")
    for k, v in d.items():
        name = path + _key(k)
        if isinstance(v, dict):
            out.append(f"\n[{name}]")
            _table(v, name + ".", out)
        elif _is_table_array(v):
            for item in v:
                out.append(f"\n[[{name}]]")
                _table(item, name + ".", out)


def dumps(config):
    """TOML text of dict `config`."""
    out = []
    _table(config, "", out)
    return "\n".join(out) + "\n"
