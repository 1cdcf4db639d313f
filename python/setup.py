# SPDX-License-Identifier: Apache-2.0
#
# setup.py - builds loom_torch's _C module with the project's meson build (in
# a temporary directory: `meson setup`, then ninja for that one target), takes
# it from `meson install --tags python-runtime` (which gives it the rpath
# $ORIGIN) and puts it into the wheel with the libloom it links, beside it.
import glob
import os
import shutil
import subprocess
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class MesonBuildExt(build_ext):
    def build_extension(self, ext):
        module = "_C" + sysconfig.get_config_var("EXT_SUFFIX")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="loom-torch-build-") as build:
            subprocess.check_call(["meson", "setup", build, ROOT, "-Dtorch=enabled",
                                   "--buildtype=release", "-Dtests=false"])
            subprocess.check_call(["ninja", "-C", build, "python/loom_torch/" + module])
            stage = os.path.join(build, "stage")
            subprocess.check_call(["meson", "install", "-C", build, "--no-rebuild", "--destdir",
                                   stage, "--tags", "python-runtime"])
            shutil.copyfile(glob.glob(os.path.join(stage, "**", "loom_torch", module),
                                      recursive=True)[0], dest)
            # the module's NEEDED entry is libloom's soname
            libs = [p for p in glob.glob(os.path.join(build, "src", "libloom.so.*"))
                    if not os.path.islink(p)]
            soname = subprocess.check_output(["objdump", "-p", libs[0]], text=True)
            soname = next(l.split()[1] for l in soname.splitlines() if "SONAME" in l)
            shutil.copyfile(libs[0], os.path.join(os.path.dirname(dest), soname))


setup(ext_modules=[Extension("loom_torch._C", sources=[])], cmdclass={"build_ext": MesonBuildExt})
