#!/usr/bin/env python3
"""Download and unpack one sdist from PyPI, checking its sha256.

Used by `cargo xtask reference` to obtain llama.cpp's source, which
llama-cpp-python vendors. `pip download --no-binary :all:` would also build
the package's build dependencies (cmake from source, for minutes), so this
reads PyPI's JSON API instead.

Usage: fetch_sdist.py --name NAME --version VERSION --dest DIR
Leaves DIR/<archive> and DIR/<unpacked top folder>; prints the latter.
"""

import argparse
import hashlib
import json
import os
import tarfile
import urllib.request
from urllib.parse import urljoin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--dest", required=True)
    args = parser.parse_args()

    # The project document (not /pypi/NAME/VERSION/json, which some mirrors
    # do not serve) lists every release's files.
    index_url = f"https://pypi.org/pypi/{args.name}/json"
    with urllib.request.urlopen(index_url, timeout=60) as resp:
        project = json.load(resp)
    files = project.get("releases", {}).get(args.version, [])
    sdists = [u for u in files if u["packagetype"] == "sdist"]
    if not sdists:
        raise SystemExit(f"{args.name} {args.version} has no sdist on PyPI")
    sdist = sdists[0]
    # Mirrors may answer with a URL relative to the JSON document.
    url = urljoin(index_url, sdist["url"])
    os.makedirs(args.dest, exist_ok=True)
    archive = os.path.join(args.dest, sdist["filename"])

    if not (os.path.exists(archive) and sha256(archive) == sdist["digests"]["sha256"]):
        tmp = archive + ".tmp"
        with urllib.request.urlopen(url, timeout=600) as resp, open(tmp, "wb") as out:
            while block := resp.read(1 << 20):
                out.write(block)
        digest = sha256(tmp)
        if digest != sdist["digests"]["sha256"]:
            os.remove(tmp)
            raise SystemExit(f"{url}: sha256 {digest} does not match PyPI's")
        os.replace(tmp, archive)

    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(args.dest, **kwargs)
    print(os.path.join(args.dest, top))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":
    main()
