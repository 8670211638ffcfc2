"""Only what pyproject.toml cannot say: the wheel leaves out the HIL rig's own tests,
and the optional compiled core.

``hil/`` is both the ``lockmq.hil`` package and the folder of the rig's tests
(``test_*.py``, ``conftest.py``); setuptools has no declarative way to drop modules
of a listed package.

``lockmq._core`` (the Rust crate in ``host/rust/``, issue #38) is built with cargo when
a Rust toolchain is there and skipped when not (``optional=True``): lockmq then runs
its pure-Python hot path (``lockmq.accel``). Always a release build: the core is the
broker's hot path, and a debug build of it is slower than the Python it replaces.
"""

from setuptools import setup
from setuptools.command.build_py import build_py


def _is_test_module(module: str) -> bool:
    return module.startswith("test_") or module == "conftest"


class build_py_without_tests(build_py):
    """``build_py`` that leaves test modules out of the wheel."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not _is_test_module(m[1])]


def _rust_extensions() -> dict:
    try:
        from setuptools_rust import Binding, RustExtension
    except ImportError:   # (a build without setuptools-rust: pure Python)
        return {}
    return {"rust_extensions": [RustExtension(
        "lockmq._core", path="host/rust/Cargo.toml", binding=Binding.PyO3,
        features=["python"], optional=True, debug=False)]}


setup(cmdclass={"build_py": build_py_without_tests}, **_rust_extensions())
