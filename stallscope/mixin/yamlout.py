"""A small deterministic YAML writer for the generated rule files and manifests.

Only what those files need: mappings (in insertion order), lists, strings, numbers and
booleans. Multi-line strings (PromQL, descriptions) become literal blocks (``|-``), other
strings stay plain where YAML 1.1 and 1.2 read them back as the same string, and are
double-quoted otherwise (a JSON string is a valid YAML double-quoted scalar). No PyYAML:
the package stays small and the output never depends on a library's version.
"""
import json
import re

_PLAIN = re.compile(r"^[A-Za-z_./][A-Za-z0-9_ ./()%,'=:-]*$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# Words YAML 1.1 reads as booleans or null.
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}


def _scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return "null"
    s = str(value)
    if _DURATION.match(s) or (_PLAIN.match(s) and s.lower() not in _RESERVED
                               and not s.endswith((" ", ":")) and ": " not in s and " #" not in s):
        return s
    return json.dumps(s, ensure_ascii=False)


def _block(s, indent):
    pad = " " * indent
    return "|-\n" + "\n".join((pad + line) if line else "" for line in s.split("\n"))


def _emit(value, indent, out):
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            out[-1] += " {}"
            return
        for key, v in value.items():
            _emit_item(pad + _scalar(key) + ":", v, indent, out)
    elif isinstance(value, (list, tuple)):
        if not value:
            out[-1] += " []"
            return
        for v in value:
            _emit_item(pad + "-", v, indent, out, in_list=True)
    else:
        raise TypeError("not a collection: %r" % (value,))


def _emit_item(head, v, indent, out, in_list=False):
    if isinstance(v, dict) and v and in_list:
        # "- key: value" with the rest of the mapping aligned under the first key.
        sub = []
        _emit(v, indent + 2, sub)
        out.append(head + " " + sub[0].lstrip())
        out.extend(sub[1:])
    elif isinstance(v, (dict, list, tuple)) and v:
        out.append(head)
        _emit(v, indent + 2, out)
    elif isinstance(v, (dict, list, tuple)):
        out.append(head + (" {}" if isinstance(v, dict) else " []"))
    elif isinstance(v, str) and _scalar(v).startswith('"') and v[:1].strip() and v == v.rstrip():
        # PromQL and templates full of quotes and braces read better as literal blocks
        # than escaped; a literal block needs no escaping at all.
        out.append(head + " " + _block(v.rstrip("\n"), indent + 2))
    else:
        out.append(head + " " + _scalar(v))


def dump(doc):
    """YAML text for ``doc`` (a mapping), ending with a newline."""
    out = []
    _emit(doc, 0, out)
    return "\n".join(out) + "\n"
