"""Runs a notebook top to bottom with nbclient, in this interpreter's kernel.

Usage: python scripts/run_notebook.py NOTEBOOK WORKDIR

Used by `scripts/check_wheel.sh` from a fresh virtual environment: the
notebook runs in WORKDIR (outside the source tree) in a kernel of this
interpreter, and a last cell, added here, reports the kernel's `sys.prefix`
and where `maskedrnn` was imported from. This script fails unless that is
this environment and its site-packages, i.e. the notebook ran on the
maskedrnn its own install cell installed, not on a source checkout.
"""

import json
import os
import sys

import nbclient
import nbformat

_REPORT = (
    "import json, sys, maskedrnn\n"
    "print('MASKEDRNN_KERNEL ' + json.dumps("
    "{'prefix': sys.prefix, 'file': maskedrnn.__file__}))"
)


def main(notebook_path, workdir):
    notebook = nbformat.read(notebook_path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(_REPORT))
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": workdir}},
    )
    client.execute()  # raises CellExecutionError with the traceback
    text = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    report = json.loads(text.split("MASKEDRNN_KERNEL ", 1)[1])
    prefix = os.path.realpath(sys.prefix)
    site = os.path.realpath(os.path.dirname(os.path.dirname(report["file"])))
    if os.path.realpath(report["prefix"]) != prefix:
        sys.exit(f"the kernel ran in {report['prefix']}, not in {prefix}")
    if not site.startswith(prefix) or "site-packages" not in site:
        sys.exit(f"maskedrnn was imported from {report['file']}, not installed")
    print(f"{os.path.basename(notebook_path)}: ran; maskedrnn from {report['file']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
