"""Prints README.md's two commands, one a line, as a user would type them.

They are the lines of the bash block under README.md's heading "## The two
commands", each without its trailing comment: first the demo's install and
run, then the tests. `.ci/run` runs them in that order in a fresh virtual
environment, so CI runs exactly what README.md tells a user to run.

Usage: python scripts/readme_commands.py [README]
"""

import pathlib
import re
import sys

HEADING = "## The two commands"


def readme_commands(text):
    """The command lines of the first bash block after `HEADING` in `text`.

    Raises:
        ValueError: when the heading or its bash block is missing.
    """
    if HEADING not in text:
        raise ValueError(f"README.md has no heading {HEADING!r}")
    after = text.split(HEADING, 1)[1]
    block = re.search(r"^```bash\n(.*?)^```", after, flags=re.M | re.S)
    if block is None:
        raise ValueError(f"README.md has no ```bash block under {HEADING!r}")
    commands = []
    for line in block.group(1).splitlines():
        # A comment starts at a '#' after whitespace; the commands quote no '#'.
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def main(argv):
    root = pathlib.Path(__file__).resolve().parents[1]
    path = pathlib.Path(argv[0]) if argv else root / "README.md"
    for command in readme_commands(path.read_text()):
        print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
