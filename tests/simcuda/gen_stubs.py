#!/usr/bin/env python3
"""Build-time generator for the simulated CUDA device (tests/simcuda).

Sub-commands (all paths are written by CMake, see CMakeLists.txt):

  tables   --cc CC --include DIR --out FILE
      Error-code name tables for the runtime (enum cudaError) and the driver
      (enum cudaError_enum), and the driver's "base name -> exported name"
      aliases (#define cuMemGetInfo cuMemGetInfo_v2), read from the toolkit
      headers after preprocessing.

  runtime  --cc CC --nm NM --include DIR --real-lib LIB --out FILE OBJECTS...
      One stub for every function that the toolkit's libcudart.so.13 exports
      (nm -D --defined-only) and that no hand-written object defines. Stubs for
      functions declared in the headers copy the declaration's parameter list,
      so the C++ compiler checks them against the header; every stub must
      return cudaError_t (anything else has to be written by hand, and the
      generator stops the build naming it).

  driver   --cc CC --nm NM --include DIR --out FILE OBJECTS...
      One stub for every CUresult function declared in cuda.h that the
      hand-written driver objects do not define.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

PER_THREAD_SUFFIXES = ("_ptsz", "_ptds")


def run(cmd):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout


def preprocess(cc, include_dir, headers, macros_only=False):
    """Preprocesses `headers` as C (so default arguments vanish)."""
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as src:
        for header in headers:
            src.write("#include <%s>\n" % header)
        path = src.name
    try:
        cmd = [cc, "-E", "-P", "-I", include_dir, path]
        if macros_only:
            cmd.insert(1, "-dM")
        return run(cmd)
    finally:
        os.unlink(path)


def exported_functions(nm, library):
    """Names of the functions a shared library exports (version suffix cut)."""
    names = []
    for line in run([nm, "-D", "--defined-only", library]).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "W", "i"):
            names.append(parts[2].split("@")[0])
    return sorted(set(names))


def defined_in_objects(nm, objects):
    names = set()
    for obj in objects:
        for line in run([nm, "--defined-only", "-g", obj]).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("T", "W"):
                names.add(parts[2])
    return names


def find_declaration(text, name):
    """Returns (return_type, params) of `name` in preprocessed C text."""
    for match in re.finditer(r"\b%s\s*\(" % re.escape(name), text):
        start = max(text.rfind(";", 0, match.start()),
                    text.rfind("}", 0, match.start()),
                    text.rfind("{", 0, match.start()))
        head = text[start + 1:match.start()]
        if "extern" not in head and "CUresult" not in head:
            continue
        head = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", head, flags=re.S)
        head = re.sub(r"\bextern\b", " ", head)
        ret = " ".join(head.split())
        depth, pos = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[pos], 0)
            pos += 1
        params = " ".join(text[match.end():pos - 1].split())
        return ret, params
    return None


_RAW_HEADERS = {}


def raw_headers(include_dir):
    """The text of every header directly in `include_dir`, read once."""
    if include_dir not in _RAW_HEADERS:
        texts = []
        for entry in sorted(os.listdir(include_dir)):
            if entry.endswith(".h"):
                with open(os.path.join(include_dir, entry), errors="replace") as f:
                    texts.append(f.read())
        _RAW_HEADERS[include_dir] = texts
    return _RAW_HEADERS[include_dir]


def raw_return_type(include_dir, name):
    """Return type of `name` in any raw header (interop headers such as
    cuda_gl_interop.h need system headers this machine may not have)."""
    pattern = re.compile(r"([\w\s\*]+?)\s+CUDARTAPI\s+%s\s*\(" % re.escape(name))
    for text in raw_headers(include_dir):
        if name not in text:
            continue
        match = pattern.search(text)
        if match:
            return match.group(1).split()[-1]
    return None


def base_name(name):
    for suffix in PER_THREAD_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def cmd_tables(args):
    text = preprocess(args.cc, args.include, ["cuda_runtime_api.h", "cuda.h"])
    runtime_enum = re.search(r"enum cudaError\s*\{(.*?)\}", text, re.S).group(1)
    driver_enum = re.search(r"enum cudaError_enum\s*\{(.*?)\}", text, re.S).group(1)
    macros = preprocess(args.cc, args.include, ["cuda.h"], macros_only=True)
    out = ["// Generated by gen_stubs.py from the CUDA toolkit headers. Do not edit.",
           "// Error-code names and driver API aliases."]
    for table, enum in (("kRuntimeErrorNames", runtime_enum),
                        ("kDriverErrorNames", driver_enum)):
        out.append("static const ::simcuda::CodeName %s[] = {" % table)
        for ident, value in re.findall(r"(\w+)\s*=\s*(\d+)", enum):
            out.append('    {%s, "%s"},' % (value, ident))
        out.append("};")
    out.append("static const ::simcuda::Alias kDriverAliases[] = {")
    # "#define cuX cuX_v2", or "#define cuX __CUDA_API_PTSZ(cuX_v2)" for calls
    # that have per-thread-stream variants (the plain name is the default).
    alias = r"^#define (cu[A-Z]\w*) (?:__CUDA_API_PT(?:SZ|DS)\()?(cu\w+)\)?$"
    for base, target in re.findall(alias, macros, re.M):
        if base != target:
            out.append('    {"%s", "%s"},' % (base, target))
    out.append("};")
    write_if_changed(args.out, "\n".join(out) + "\n")


STUB_HEADER = """// Generated by gen_stubs.py. Do not edit.
// Stubs for the %(what)s calls that tests/simcuda does not simulate: each one
// is counted, reports "simcuda: unsupported <name>" once on stderr and fails
// with %(error)s.
"""


def cmd_runtime(args):
    exports = exported_functions(args.nm, args.real_lib)
    implemented = defined_in_objects(args.nm, args.objects)
    text = preprocess(args.cc, args.include,
                      ["cuda_runtime_api.h", "cuda_profiler_api.h"])
    out = [STUB_HEADER % {"what": "CUDA runtime", "error": "cudaErrorNotSupported"},
           "#include <cuda_profiler_api.h>",
           "#include <cuda_runtime_api.h>",
           '#include "runtime/api_entry.h"',
           "",
           "// NOLINTBEGIN",
           'extern "C" {']
    # Names the headers #define to another call (CUDA 12: cudaGetDeviceProperties
    # -> cudaGetDeviceProperties_v2) whose old export the library keeps: the
    # stub of the old symbol must not be renamed by the macro.
    macros = set(re.findall(r"^#define (\w+)", preprocess(
        args.cc, args.include, ["cuda_runtime_api.h", "cuda_profiler_api.h"], macros_only=True),
        re.M))
    problems = []
    for name in exports:
        if name in implemented:
            continue
        if name in macros:
            out.append("#undef %s" % name)
        decl = find_declaration(text, name)
        if decl:
            ret, params = decl
            signature = "%s %s(%s)" % (ret, name, params)
        else:
            ret = raw_return_type(args.include, base_name(name))
            if ret is None:
                decl = find_declaration(text, base_name(name))
                ret = decl[0] if decl else None
            signature = "cudaError_t %s(void)" % name
        if ret != "cudaError_t":
            problems.append("%s (returns %s)" % (name, ret or "unknown type"))
            continue
        out.append("%s {" % signature)
        out.append('  SIMCUDA_ENTER_NAMED("%s");' % name)
        out.append("  return ::simcuda::rt::Unsupported(simcuda_site);")
        out.append("}")
    out += ["}  // extern \"C\"", "// NOLINTEND"]
    if problems:
        sys.exit("gen_stubs.py: these libcudart exports do not return cudaError_t "
                 "and must be written by hand in tests/simcuda/src/runtime: "
                 + ", ".join(problems))
    write_if_changed(args.out, "\n".join(out) + "\n")


def cmd_driver(args):
    implemented = defined_in_objects(args.nm, args.objects)
    text = preprocess(args.cc, args.include, ["cuda.h"])
    names = sorted(set(re.findall(r"^CUresult\s+(cu\w+)\s*\(", text, re.M)))
    out = [STUB_HEADER % {"what": "CUDA driver", "error": "CUDA_ERROR_NOT_SUPPORTED"},
           "#include <cuda.h>",
           '#include "driver/driver_entry.h"',
           "",
           "// NOLINTBEGIN",
           'extern "C" {']
    for name in names:
        if name in implemented:
            continue
        ret, params = find_declaration(text, name)
        out.append("%s %s(%s) {" % (ret, name, params))
        out.append('  SIMCUDA_DRIVER_ENTER_NAMED("%s");' % name)
        out.append("  return ::simcuda::drv::Unsupported(simcuda_site);")
        out.append("}")
    out += ["}  // extern \"C\"", "// NOLINTEND"]
    write_if_changed(args.out, "\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("tables", cmd_tables), ("runtime", cmd_runtime),
                       ("driver", cmd_driver)):
        p = sub.add_parser(name)
        p.set_defaults(func=func)
        p.add_argument("--out", required=True)
        p.add_argument("--cc", required=True)
        p.add_argument("--include", required=True)
        if name != "tables":
            p.add_argument("--nm", required=True)
            p.add_argument("objects", nargs="+")
        if name == "runtime":
            p.add_argument("--real-lib", required=True)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
