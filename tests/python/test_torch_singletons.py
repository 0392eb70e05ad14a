"""torchmem's modules share torch's singletons instead of carrying copies of their own.

c10 keeps process-wide state (the CUDA allocator settings, the hook that hears of
settings changed at run time) in static variables of functions that its headers
define inline. Every library that calls such a function gets a copy of the static,
marked STB_GNU_UNIQUE ("u" in nm), and the dynamic linker binds all the copies to
one. A copy that lost that marking (GCC's link-time optimization emits a plain
global) or that a version script made local is a second object: torchmem would read
settings c10 never updates, or register a hook c10 never calls. This reads the symbol
tables of the built modules, for the torch they were built against.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import torchmem

PACKAGE = Path(torchmem.__file__).parent
# A static variable of a function of torch's namespaces, as nm -C names it:
# "c10::...::instance()::s_instance".
TORCH_FUNCTION_STATIC = re.compile(r"^(?:guard variable for )?(?:c10|at|torch|caffe2)::.*\)(?: const)?::\w+$")
# TORCH_WARN_ONCE's flag: a copy of its own only means one more warning.
WARN_ONCE_FLAG = re.compile(r"::torch_warn_once_\d+$")


def torch_statics_not_shared(library: Path) -> list[str]:
    """The function statics of torch's namespaces that `library` defines as a copy of its own."""
    listing = subprocess.run(["nm", "-C", "--defined-only", str(library)], capture_output=True,
                             text=True, check=True).stdout
    if not listing.strip():  # stripped: the dynamic symbol table still lists what it exports
        listing = subprocess.run(["nm", "-C", "-D", "--defined-only", str(library)],
                                 capture_output=True, text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        fields = line.split(" ", 2)
        if len(fields) < 3:
            continue
        kind, name = fields[1], fields[2]
        if kind != "u" and TORCH_FUNCTION_STATIC.match(name) and not WARN_ONCE_FLAG.search(name):
            found.append(f"{kind} {name}")
    return found


def built_libraries() -> list[Path]:
    return sorted(PACKAGE.glob("_C*.so")) + sorted((PACKAGE / "lib").glob("libtorchmem*.so"))


def test_the_modules_bind_torchs_inline_statics_to_torchs_own():
    assert shutil.which("nm"), "nm (binutils) is needed to read the modules' symbol tables"
    libraries = built_libraries()
    assert any(library.name.startswith("_C.") for library in libraries), f"no built module in {PACKAGE}"
    copies = {library.name: torch_statics_not_shared(library) for library in libraries}
    assert {name: found for name, found in copies.items() if found} == {}


def test_the_check_sees_a_copy_that_is_not_shared(tmp_path):
    # The same header pattern, built once as usual and once without the unique binding
    # (-fno-gnu-unique: a weak global that the dynamic linker does not merge).
    source = tmp_path / "config.cc"
    source.write_text("namespace c10 { struct Config { static int& instance() { static int s_instance = 0;"
                      " return s_instance; } }; }\nint Touch() { return ++c10::Config::instance(); }\n")
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler on PATH: the extension could not have been built either"
    built = {}
    for name, flags in (("unique", []), ("copy", ["-fno-gnu-unique"])):
        built[name] = tmp_path / f"lib{name}.so"
        subprocess.run([compiler, "-O2", "-fPIC", "-shared", *flags, str(source), "-o", str(built[name])],
                       check=True)
    assert torch_statics_not_shared(built["unique"]) == []
    assert torch_statics_not_shared(built["copy"]) == ["V c10::Config::instance()::s_instance"]
