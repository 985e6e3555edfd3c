"""Build script for tirbyoc's C kernel library (metadata is in pyproject.toml).

Two artifacts are produced from the same C sources and flags:
  * tirbyoc/_kernels*.so       - the cffi extension (via ``cffi_modules``);
  * tirbyoc/libtirbyoc_kernels.o - one relocatable, position-independent
    object without any Python symbols, which TVM links into generated code
    through ``tvm.runtime.load_static_library``.

Both are rebuilt on every build so that ``pip install -e .`` always picks up
edits to the C code.
"""

import glob
import os
import runpy
import types

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "tirbyoc"
STATIC_OBJECT = "libtirbyoc_kernels.o"

# Source list, include dirs and flags live in the cffi build script only.
_KERNEL_BUILD = runpy.run_path(os.path.join(HERE, PACKAGE, "_build_kernels.py"))


class build_ext_with_static_object(build_ext):
    """build_ext that also emits the kernels as one relocatable object."""

    def finalize_options(self):
        super().finalize_options()
        # Timestamps are not trusted (the header is not tracked by the
        # object build, and pip may reuse build dirs): always rebuild.
        self.force = True

    def build_extension(self, ext):
        # The files of the extension compile in parallel; the kernels' objects
        # are kept for the static object, which has the same sources and flags.
        compiled = self._kernel_objects = {}
        compile_files = _KERNEL_BUILD["compile_in_parallel"]

        def compile_and_keep(compiler, sources, *args, **kwargs):
            objects = compile_files(compiler, sources, *args, **kwargs)
            compiled.update(zip(map(os.path.normpath, sources), objects))
            return objects

        self.compiler.compile = types.MethodType(compile_and_keep, self.compiler)
        super().build_extension(ext)

    def run(self):
        super().run()
        self._build_static_object()
        if self.inplace:
            self._remove_other_builds()

    def _remove_other_builds(self):
        """Removes the extension's other builds from the package directory: Python
        imports a tirbyoc/_kernels.cpython-311-*.so before tirbyoc/_kernels.abi3.so, so
        one left there by an earlier build under another name would run (and be tested)
        instead of the kernels just built."""
        for ext in self.extensions:
            built = os.path.abspath(self.get_ext_fullpath(ext.name))
            folder = os.path.dirname(built)
            for other in glob.glob(os.path.join(folder, ext.name.split(".")[-1] + ".*.so")):
                if os.path.abspath(other) != built:
                    self.announce(f"removing {other}: another build of {ext.name}", level=2)
                    os.remove(other)

    def _static_object_paths(self):
        built = os.path.join(self.build_lib, PACKAGE, STATIC_OBJECT)
        package_dir = self.get_finalized_command("build_py").get_package_dir(PACKAGE)
        return built, os.path.join(package_dir, STATIC_OBJECT)

    def _build_static_object(self):
        built, inplace = self._static_object_paths()
        sources = _KERNEL_BUILD["KERNEL_SOURCES"]
        kept = getattr(self, "_kernel_objects", {})
        if all(os.path.normpath(src) in kept for src in sources):
            # the extension's objects: the same sources, flags and -fPIC
            objects = [kept[os.path.normpath(src)] for src in sources]
        else:
            # self.compiler is the compiler that just built the cffi extension.
            objects = self.compiler.compile(
                sources,
                output_dir=os.path.join(self.build_temp, "static"),
                include_dirs=_KERNEL_BUILD["INCLUDE_DIRS"],
                extra_postargs=list(_KERNEL_BUILD["EXTRA_COMPILE_ARGS"]) + ["-fPIC"],
                depends=[_KERNEL_BUILD["HEADER"]],
            )
        self.mkpath(os.path.dirname(built))
        # "-r": partial link of all kernel objects into one relocatable object
        # (also for a single object, so there is one code path). Without the
        # debug information the objects carry from the compiler flags, except
        # in a sanitizer build (its reports name source lines): every exported
        # model library links this object, and it was 16.8 MB of which 1.3 MB
        # is code and data (MobileNetV2's library: 21.8 MB for 8.6 MB of
        # weights).
        cc = _KERNEL_BUILD["compiler_command"](self.compiler)
        strip = [] if os.environ.get(_KERNEL_BUILD["SANITIZE_ENV"]) else ["-Wl,--strip-debug"]
        self.spawn(cc + ["-r", "-nostdlib"] + strip + ["-o", built] + objects)
        if self.inplace:
            self.copy_file(built, inplace, level=self.verbose)

    def get_outputs(self):
        outputs = super().get_outputs()
        built, _ = self._static_object_paths()
        if built not in outputs:
            outputs.append(built)
        return outputs

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        if self.inplace:
            built, inplace = self._static_object_paths()
            mapping[built] = inplace
        return mapping


setup(
    cffi_modules=["tirbyoc/_build_kernels.py:ffibuilder"],
    cmdclass={"build_ext": build_ext_with_static_object},
)
