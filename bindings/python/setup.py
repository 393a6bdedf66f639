"""Builds the native module `prosody.prosody` and, first, libprosody itself
from the same source tree (CMake, static library), so the installed package
needs only the system libraries scripts/deps.sh installs (jansson, libuv,
libmicrohttpd, libcurl, and what librdkafka needs: ssl, sasl, zstd, lz4,
zlib). librdkafka itself is inside libprosody.a (CMake links a current one,
built from Debian's source package when the system has none of at least
2.10.0) and stays private to the extension."""

import os
import shlex
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PKGS = ["jansson", "libuv", "libmicrohttpd", "libcurl"]


def pkg_config(flag):
    try:
        out = subprocess.run(["pkg-config", flag, *PKGS], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            f"prosody: pkg-config {flag} {' '.join(PKGS)} failed ({e}); install the "
            "system libraries first (scripts/deps.sh in the source tree)") from e
    return shlex.split(out)


class BuildWithLibprosody(build_ext):
    """Builds libprosody.a with CMake, then the extension against it."""

    def run(self):
        if not (ROOT / "CMakeLists.txt").exists() or not (ROOT / "include" / "prosody.h").exists():
            raise SystemExit(
                "prosody: the libprosody sources were not found at "
                f"{ROOT}; install from the Prosody-C source tree "
                "(pip install bindings/python)")
        build = Path(self.build_temp).resolve() / "libprosody"
        jobs = os.environ.get("PROSODY_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build),
                        "-DCMAKE_BUILD_TYPE=Release", "-DPROSODY_TESTS=OFF",
                        "-DPROSODY_BENCH=OFF"], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "prosody_static",
                        "-j", jobs], check=True)
        libs = shlex.split((build / "libprosody-static.libs").read_text())
        for ext in self.extensions:
            ext.extra_objects = [str(build / "libprosody.a")]
            ext.extra_link_args += libs
            ext.include_dirs.append(str(ROOT / "include"))
        # build_ext compares the module's own sources only: relink whenever
        # the library may have changed (a few small C files: cheap).
        self.force = True
        super().run()


ext = Extension(
    "prosody.prosody",
    # Every C file of src/ (one per type; src/prosody_py.h lists them).
    sources=sorted(str(p.relative_to(HERE)) for p in (HERE / "src").glob("*.c")),
    extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wno-unused-parameter",
                        *[f for f in pkg_config("--cflags") if f.startswith("-I")]],
    # The static library's symbols stay private to the extension.
    extra_link_args=["-Wl,--exclude-libs,ALL"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildWithLibprosody})
