"""Regression tests for the defects a new-user trial found (issue 11), one test each:
ctypes_quickstart and a dangling build directory; docs/python.md and python/README stating the same
minimum library version; allow_from_keep_int(NaN) without a numpy warning; the 32-bit limit on
L, S, E, Ev and its message; hints in Python keyword names. (out=[0]*10: test_interop.py;
mha_from_pytorch from the repository root: examples/meson.build runs every example there.)"""
import importlib.util
import os
import re
import tempfile
import unittest
import warnings

import numpy as np

import reference as ref

import sdpa
from sdpa import _lib

QUICKSTART = os.path.join(ref.REPO, "examples", "python", "ctypes_quickstart.py")


class QuickstartLookupTest(unittest.TestCase):
    def test_dangling_build_dir_is_skipped(self):
        spec = importlib.util.spec_from_file_location("ctypes_quickstart", QUICKSTART)
        quickstart = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(quickstart)
        with tempfile.TemporaryDirectory() as root:
            # build/: configured, not built (no library); build-x/: a dangling libsdpa.so link
            os.mkdir(os.path.join(root, "build"))
            os.mkdir(os.path.join(root, "build-x"))
            os.symlink("libsdpa.so.0", os.path.join(root, "build-x", "libsdpa.so"))
            found = quickstart.find_library(["prog"], {}, root)
            self.assertTrue(found is None or found[1] == "system", found)
            # a real file in build-y/ is found
            os.mkdir(os.path.join(root, "build-y"))
            open(os.path.join(root, "build-y", "libsdpa.so"), "wb").close()
            self.assertEqual(quickstart.find_library(["prog"], {}, root),
                             (os.path.join(root, "build-y", "libsdpa.so"), "build tree"))


class DocumentedVersionTest(unittest.TestCase):
    def test_readmes_state_the_package_minimum(self):
        major, minor = _lib.EXPECTED_VERSION[:2]
        texts = {}
        for rel in (os.path.join("docs", "python.md"), os.path.join("python", "README.md")):
            path = os.path.join(ref.REPO, rel)
            if os.path.exists(path):  # the installed-package run has no docs
                with open(path, encoding="utf-8") as fh:
                    texts[rel] = fh.read()
        texts["sdpa.__doc__"] = sdpa.__doc__
        for where, text in texts.items():
            stated = re.findall(r"(\d+)\.x with x >= (\d+)", " ".join(text.split()))
            self.assertTrue(stated, f"{where} states no minimum version")
            for s in stated:
                self.assertEqual((int(s[0]), int(s[1])), (major, minor), where)


class KeepIntNaNTest(unittest.TestCase):
    def test_nan_raises_without_warning(self):
        for bad in (np.array([np.nan, 1.0]), np.array([1.0, np.inf]), np.array([0.0, 0.5])):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a RuntimeWarning would fail here
                with self.assertRaises(sdpa.SdpaArgumentError) as cm:
                    sdpa.allow_from_keep_int(bad)
            self.assertIn("neither 0 nor 1", cm.exception.message)


class ThirtyTwoBitLimitTest(unittest.TestCase):
    def test_message_names_the_reason_not_blas(self):
        z = np.zeros(4, np.float32)
        big = np.lib.stride_tricks.as_strided(z, shape=(1, 1, 2 ** 31, 4), strides=(0, 0, 0, 4))
        k = np.zeros((1, 1, 3, 4), np.float32)
        v = np.zeros((1, 1, 3, 1), np.float32)
        out = np.lib.stride_tricks.as_strided(z[:1], shape=(1, 1, 2 ** 31, 1),
                                              strides=(0, 0, 0, 4))
        for kernel in ("auto", "tiled", "decode"):  # paths that never call BLAS
            with self.assertRaises(sdpa.SdpaShapeError) as cm:
                sdpa.scaled_dot_product_attention(big, k, v, out=out, kernel=kernel)
            e = cm.exception
            self.assertEqual(e.name, "SDPA_ERR_SIZE_OVERFLOW")
            self.assertIn("L=2147483648", e.message)
            self.assertIn("32 bits", e.message)
            self.assertNotIn("BLAS", e.message)


class LoaderOrderTest(unittest.TestCase):
    """SDPA_LIBRARY, then the package's bundled copy, then the build tree, then the system."""

    def test_order(self):
        saved_env = os.environ.pop("SDPA_LIBRARY", None)
        saved = _lib.bundled_candidates, _lib.build_tree_candidates
        try:
            with tempfile.TemporaryDirectory() as pkg:
                for name in ("libsdpa.so.0", "libsdpa.so"):
                    open(os.path.join(pkg, name), "wb").close()
                self.assertEqual(_lib.bundled_candidates(pkg),
                                 [os.path.join(pkg, "libsdpa.so"), os.path.join(pkg, "libsdpa.so.0")])
                _lib.bundled_candidates = lambda: [os.path.join(pkg, "libsdpa.so")]
                _lib.build_tree_candidates = lambda: ["/repo/build/libsdpa.so"]
                self.assertEqual(_lib.find_library(),
                                 (os.path.join(pkg, "libsdpa.so"), "bundled with the package"))
                os.environ["SDPA_LIBRARY"] = "/x/libsdpa.so"
                self.assertEqual(_lib.find_library(), ("/x/libsdpa.so", "SDPA_LIBRARY"))
                del os.environ["SDPA_LIBRARY"]
                _lib.bundled_candidates = lambda: []
                self.assertEqual(_lib.find_library()[0], "/repo/build/libsdpa.so")
                _lib.build_tree_candidates = lambda: []
                self.assertEqual(_lib.find_library()[1], "system loader")
        finally:
            _lib.bundled_candidates, _lib.build_tree_candidates = saved
            if saved_env is not None:
                os.environ["SDPA_LIBRARY"] = saved_env
            else:
                os.environ.pop("SDPA_LIBRARY", None)


class PythonHintsTest(unittest.TestCase):
    def test_keyword_names_in_hints(self):
        q = np.zeros((1, 1, 3, 4), np.float32)
        with self.assertRaises(sdpa.SdpaValueError) as cm:
            sdpa.scaled_dot_product_attention(q, q, q, attn_mask=np.zeros((3, 3), bool))
        self.assertIn('empty_rows="zero"', cm.exception.message)
        self.assertNotIn("SDPA_EMPTY_ROWS", cm.exception.message)
        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
            sdpa.scaled_dot_product_attention(q, q, q, kernel="tiled", need_weights=True)
        m = cm.exception.message
        self.assertIn('kernel="tiled"', m)
        self.assertIn("need_weights=False", m)
        self.assertNotIn("SDPA_KERNEL", m)
        self.assertNotIn("NULL", m)


if __name__ == "__main__":
    unittest.main()
