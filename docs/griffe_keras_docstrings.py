"""Griffe extension: renders Keras-style docstrings with mkdocstrings.

maskedrnn's docstrings follow Keras' conventions, which differ from the
Google style that griffe parses in three ways. This extension rewrites each
docstring before it is parsed (the source files are not touched):

- `Example:` followed by unindented content (doctest `>>>` lines or fenced
  code) becomes a Google `Examples:` section with the content indented, so
  doctests render as code instead of Markdown block quotes.
- `Call arguments:` (or `Call arguments (qualifier):`) items
  (`name: description`, continuation lines indented further) become a
  bulleted list in an admonition with that title; without this they run
  together into one paragraph.
- `Input shape:` / `Output shape:` are left as admonitions (what griffe
  already makes of them).

Loaded by `mkdocs.yml` (`plugins.mkdocstrings.handlers.python.options.
extensions`).
"""

import re

import griffe

# Section titles that start a new section at the docstring's base indentation.
_SECTION = re.compile(
    r"^(Args|Arguments|Call arguments|Input shape|Output shape|Returns|Yields|"
    r"Raises|Attributes|Example|Examples|Note|Notes|References?|Warnings?)"
    r"( \(.*\))?:\s*$"
)
_ITEM = re.compile(r"^(\*{0,2}\w+):\s*(.*)$")


def _is_fence(line):
    return line.lstrip().startswith("```")


def _section_end(lines, start):
    """Index of the first line after the body that starts at `start`.

    The body ends at the next section title at indentation 0 outside fenced
    code, or at the end of the docstring.
    """
    in_fence = False
    for i in range(start, len(lines)):
        if _is_fence(lines[i]):
            in_fence = not in_fence
        elif not in_fence and _SECTION.match(lines[i]):
            return i
    return len(lines)


def _indented(body):
    """`body` without its common indentation, then indented by 4 spaces."""
    while body and not body[0].strip():
        body = body[1:]
    while body and not body[-1].strip():
        body = body[:-1]
    indents = [len(line) - len(line.lstrip()) for line in body if line.strip()]
    cut = min(indents, default=0)
    return ["    " + line[cut:] if line.strip() else "" for line in body]


def _call_arguments(body):
    """Turns `name: description` items into a Markdown bulleted list."""
    out = []
    for line in _indented(body):
        text = line[4:]
        match = _ITEM.match(text)
        if match and not text.startswith(" "):
            out.append(f"    - `{match.group(1)}`: {match.group(2)}")
        elif text.strip():
            out.append("      " + text.strip())
        else:
            out.append("")
    return out


def rewrite(text):
    """Returns the Keras-style docstring `text` in griffe's Google style."""
    lines = text.split("\n")
    out = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        if _is_fence(line):
            in_fence = not in_fence
        title = None if in_fence else _SECTION.match(line)
        if title and title.group(1) in ("Example", "Examples", "Call arguments"):
            end = _section_end(lines, i + 1)
            body = lines[i + 1 : end]
            if title.group(1) == "Call arguments":
                # An admonition; its title keeps a qualifier such as
                # "Call arguments (`update_state`)".
                heading = line.strip().rstrip(":")
                out += [f"Call arguments: {heading}"] + _call_arguments(body)
            else:
                out += ["Examples:"] + _indented(body)
            if end < len(lines):
                out.append("")
            i = end
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class KerasDocstrings(griffe.Extension):
    """Rewrites Keras-style docstrings (see the module docstring)."""

    def on_object(self, *, obj, **kwargs):
        docstring = obj.docstring
        if docstring is None or obj.is_alias:
            return
        new = rewrite(docstring.value)
        if new != docstring.value:
            docstring.value = new
            # `parsed` is a cached property: drop a value computed earlier.
            docstring.__dict__.pop("parsed", None)
