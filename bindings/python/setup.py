"""Builds the native module `prosody.prosody` and, first, libprosody itself
(CMake, static library), so the installed package needs only the system
libraries scripts/deps.sh installs (jansson, libuv, libmicrohttpd, libcurl,
and what librdkafka needs: ssl, sasl, zstd, lz4, zlib). librdkafka itself is
inside libprosody.a (CMake links a current one, built from Debian's source
package when the system has none of at least 2.10.0) and stays private to
the extension.

Where libprosody's sources come from, in order: `libprosody/` beside this
file (the source distribution carries them there: `make dist-python`), else
the repository this directory sits in (`pip install bindings/python`).
PROSODY_LIBPROSODY_BUILD=DIR links the libprosody.a of an existing CMake
build directory instead of building one (`make dist-python` builds the
library once for every interpreter's wheel)."""

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PKGS = ["jansson", "libuv", "libmicrohttpd", "libcurl"]
SUPPORTED = ("prosody-events supports CPython 3.8 or newer on Linux: prebuilt wheels for "
             "x86_64 (manylinux, glibc), else a build from the source distribution, which "
             "needs a C compiler, CMake, pkg-config and the -dev packages of jansson, libuv, "
             "libmicrohttpd, libcurl, OpenSSL, Cyrus SASL, zstd, lz4 and zlib")

# Refused here, at install time, rather than at import with a missing symbol.
if not sys.platform.startswith("linux") or platform.python_implementation() != "CPython":
    raise SystemExit(f"prosody: this is {platform.python_implementation()} on {sys.platform}; "
                     f"{SUPPORTED}")


def source_root():
    for root in (HERE / "libprosody", HERE.parent.parent):
        if (root / "CMakeLists.txt").exists() and (root / "include" / "prosody.h").exists():
            return root
    raise SystemExit(
        f"prosody: the libprosody sources are neither in {HERE / 'libprosody'} (a source "
        f"distribution made by `make dist-python`) nor in {HERE.parent.parent} (a checkout of "
        "Prosody-C: pip install bindings/python)")


def pkg_config(flag):
    try:
        out = subprocess.run(["pkg-config", flag, *PKGS], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            f"prosody: pkg-config {flag} {' '.join(PKGS)} failed ({e}); install the system "
            f"libraries first (scripts/deps.sh in the source tree). {SUPPORTED}") from e
    return shlex.split(out)


class BuildWithLibprosody(build_ext):
    """Builds libprosody.a with CMake, then the extension against it."""

    def run(self):
        root = source_root()
        given = os.environ.get("PROSODY_LIBPROSODY_BUILD")
        if given:
            build = Path(given).resolve()
        else:
            if not shutil.which("cmake"):
                raise SystemExit(f"prosody: cmake not found on PATH. {SUPPORTED}")
            build = Path(self.build_temp).resolve() / "libprosody"
            jobs = os.environ.get("PROSODY_BUILD_JOBS", str(os.cpu_count() or 2))
            subprocess.run(["cmake", "-S", str(root), "-B", str(build),
                            "-DCMAKE_BUILD_TYPE=Release", "-DPROSODY_TESTS=OFF",
                            "-DPROSODY_BENCH=OFF"], check=True)
            subprocess.run(["cmake", "--build", str(build), "--target", "prosody_static",
                            "-j", jobs], check=True)
        for need in ("libprosody.a", "libprosody-static.libs"):
            if not (build / need).exists():
                raise SystemExit(f"prosody: {build} has no {need} (PROSODY_LIBPROSODY_BUILD "
                                 "must be a CMake build directory of libprosody)")
        libs = shlex.split((build / "libprosody-static.libs").read_text())
        for ext in self.extensions:
            ext.extra_objects = [str(build / "libprosody.a")]
            ext.extra_link_args += libs
            ext.include_dirs.append(str(root / "include"))
        # build_ext compares the module's own sources only: relink whenever
        # the library may have changed (a few C files: cheap).
        self.force = True
        super().run()


class SelfContainedSdist(sdist):
    """Refuses to make a source distribution without libprosody's sources."""

    def run(self):
        if not (HERE / "libprosody" / "CMakeLists.txt").exists():
            raise SystemExit("prosody: a source distribution must carry libprosody/; "
                             "make it with `make dist-python` at the top of the tree")
        super().run()


ext = Extension(
    "prosody.prosody",
    # Every C file of the module (relative paths, as setuptools wants them).
    sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "src").glob("*.c")),
    depends=sorted(str(p.relative_to(HERE)) for p in (HERE / "src").glob("*.h")),
    extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wno-unused-parameter",
                        *[f for f in pkg_config("--cflags") if f.startswith("-I")]],
    # The static library's symbols stay private to the extension.
    extra_link_args=["-Wl,--exclude-libs,ALL"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildWithLibprosody, "sdist": SelfContainedSdist})
