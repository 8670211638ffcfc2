"""Only what pyproject.toml cannot say: the wheel leaves out the HIL rig's own tests,
and the optional C hot path.

``hil/`` is both the ``lockmq.hil`` package and the folder of the rig's tests
(``test_*.py``, ``conftest.py``); setuptools has no declarative way to drop modules
of a listed package.

``lockmq._speedups`` (``host/lockmq/_speedups.c``, issue #14) is built when a C
compiler and the Python headers are there and skipped silently when not
(``optional=True``): lockmq then runs its pure-Python hot path (``lockmq.accel``).
"""

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def _is_test_module(module: str) -> bool:
    return module.startswith("test_") or module == "conftest"


class build_py_without_tests(build_py):
    """``build_py`` that leaves test modules out of the wheel."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not _is_test_module(m[1])]


setup(
    cmdclass={"build_py": build_py_without_tests},
    ext_modules=[Extension("lockmq._speedups", ["host/lockmq/_speedups.c"], optional=True,
                           extra_compile_args=["-O2", "-std=c99", "-Wall"])],
)
