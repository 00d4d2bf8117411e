#!/usr/bin/env python3
"""Copies the Docker build context, as the engine would receive it, to DEST.

    python3 ops/context.py DEST

The files are those `.dockerignore` leaves, chosen by the Docker SDK for
Python (PyPI `docker`, the `docker.utils.build` module `docker build` clients
use to pack a context), so CI can run the image's build command inside DEST
without a Docker engine: a workspace member or target that the context lacks
fails there, not first in an image build (issue 18).
"""

import os
import shutil
import sys

from docker.utils.build import exclude_paths


def ignore_patterns(root):
    """The .dockerignore lines, as the Docker SDK's own build reads them."""
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f.read().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ops/context.py DEST")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dest = os.path.abspath(sys.argv[1])
    if os.path.exists(dest):
        sys.exit(f"{dest} exists: give a new directory")
    files = 0
    for rel in sorted(exclude_paths(root, ignore_patterns(root))):
        src = os.path.join(root, rel)
        dst = os.path.join(dest, rel)
        if os.path.isdir(src) and not os.path.islink(src):
            os.makedirs(dst, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
        files += 1
    print(f"build context: {files} files in {dest}")


if __name__ == "__main__":
    main()
