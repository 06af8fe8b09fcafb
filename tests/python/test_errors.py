"""Errors (one subclass per status family, with the C message), library loading and the version
check, and the ctypes mirrors of the C structs."""
import ctypes
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import unittest
import warnings

import numpy as np

import reference as ref

import sdpa
from sdpa import _errors, _lib


def call(**kw):
    g = ref.rng(0)
    args = dict(q=ref.randn(g, 1, 2, 3, 4), k=ref.randn(g, 1, 2, 5, 4), v=ref.randn(g, 1, 2, 5, 2))
    for name in ("q", "k", "v"):
        if name in kw:
            args[name] = kw.pop(name)
    return sdpa.scaled_dot_product_attention(args["q"], args["k"], args["v"], **kw)


class ErrorFamilyTest(unittest.TestCase):
    def assertFails(self, cls, name, fragment, **kw):
        with self.assertRaises(cls) as cm:
            call(**kw)
        e = cm.exception
        self.assertIsInstance(e, sdpa.SdpaError)
        self.assertEqual(e.name, name, str(e))
        self.assertEqual(e.status, _errors.STATUS_CODES[name])
        self.assertIn(fragment, e.message)
        self.assertEqual(str(e), f"{name} ({e.status}): {e.message}")
        return e

    def test_argument_family(self):
        e = self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT",
                             "sdpa_attention: options->scale", scale=-1.0)
        self.assertIsInstance(e, ValueError)
        self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT",
                         "sdpa_attention: options->dropout_p", dropout_p=1.5)
        self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT",
                         "sdpa_attention: options->window_left", window=(-2, 0))
        self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT",
                         "key_lengths", key_lengths=[9])
        # checked by the package: names of options
        self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT", "empty_rows",
                         empty_rows="zeros")
        self.assertFails(sdpa.SdpaArgumentError, "SDPA_ERR_INVALID_ARGUMENT", "scale=0", scale=0)

    def test_shape_family(self):
        g = ref.rng(1)
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_SHAPE",
                         "sdpa_attention: key.shape[3]=5 does not match query.shape[3]=4",
                         k=ref.randn(g, 1, 2, 5, 5))
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_BROADCAST", "sdpa_attention",
                         attn_mask=np.ones((4, 5), bool))
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_RANK", "sdpa_attention",
                         q=ref.randn(g, 2, 3, 4), k=ref.randn(g, 1, 2, 5, 4))
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_SHAPE", "key_lengths", key_lengths=[1, 2])
        # an output overlapping an input
        q = ref.randn(g, 1, 2, 3, 4)
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_OVERLAP", "overlaps", q=q, out=q[..., :2])
        # a stride that is not a whole number of float32 elements (checked by the package)
        buf = np.zeros(100, np.float32)
        strided = np.lib.stride_tricks.as_strided(buf, shape=(1, 2, 3, 4), strides=(96, 48, 18, 4))
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_STRIDE", "strides[2]=18", q=strided)
        misaligned = np.frombuffer(np.zeros(4 * 24 + 1, np.uint8).data, np.uint8)[1:].view(np.float32)
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_ALIGNMENT", "aligned",
                         q=misaligned.reshape(1, 2, 3, 4))

    def test_dtype_family(self):
        g = ref.rng(2)
        # float16 is passed through to the library (test_interop.py); these are refused here.
        for bad in (np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4), ">f4")):
            e = self.assertFails(sdpa.SdpaDtypeError, "SDPA_ERR_DTYPE", "expected float32", q=bad)
            self.assertIsInstance(e, TypeError)   # a numpy-level type problem, also a TypeError
        # a byte-swapped float16 / float32 array: the hint keeps the dtype, in native order
        other = ">" if sys.byteorder == "little" else "<"
        for swapped in (other + "f2", other + "f4"):
            self.assertFails(sdpa.SdpaDtypeError, "SDPA_ERR_DTYPE", "newbyteorder('=')",
                             q=np.zeros((1, 2, 3, 4), swapped))
        self.assertFails(sdpa.SdpaDtypeError, "SDPA_ERR_DTYPE", "dtype=np.float32", q=np.zeros((1, 2, 3, 4)))
        self.assertFails(sdpa.SdpaDtypeError, "SDPA_ERR_DTYPE", "bool or uint8",
                         attn_mask=np.ones((3, 5), np.int64))
        self.assertFails(sdpa.SdpaDtypeError, "SDPA_ERR_DTYPE", "float32",
                         attn_mask=np.zeros((3, 5), np.float64))
        with self.assertRaises(TypeError):
            call(q=[[0.0]])
        # a numpy scalar is rank 0 (it raised SdpaInternalError: np.asarray copied it)
        self.assertFails(sdpa.SdpaShapeError, "SDPA_ERR_RANK", "numpy scalar", q=np.float32(1))
        # float32-only functions do not offer float16/bfloat16 in their hint
        o64, lse = np.zeros((2, 3)), np.zeros(2, np.float32)
        with self.assertRaises(sdpa.SdpaDtypeError) as cm:
            sdpa.merge(o64, lse, o64.astype(np.float32), lse)
        self.assertIn("sdpa_merge computes float32 only", cm.exception.message)
        self.assertNotIn("float16", cm.exception.message)
        del g

    def test_value_family(self):
        e = self.assertFails(sdpa.SdpaValueError, "SDPA_ERR_EMPTY_ROW", "sdpa_attention",
                             attn_mask=np.zeros((3, 5), bool))
        self.assertIn("row", e.message)
        g = ref.rng(3)
        q = ref.randn(g, 1, 2, 3, 4)
        q[0, 1, 2, 3] = np.nan
        self.assertFails(sdpa.SdpaValueError, "SDPA_ERR_NON_FINITE", "NaN", q=q)
        call(q=q, check_finite=False)  # skipped scan: no error (the NaN row gives NaN)

    def test_resource_and_internal_families(self):
        """Out-of-memory and internal errors cannot be provoked on purpose from Python; the
        mapping from the status (named by the C library's sdpa_status_string) is checked."""
        lib = _lib.get()
        for status, cls in ((50, sdpa.SdpaResourceError), (51, sdpa.SdpaResourceError),
                            (60, sdpa.SdpaInternalError), (13, sdpa.SdpaArgumentError),
                            (26, sdpa.SdpaShapeError), (41, sdpa.SdpaValueError)):
            with self.assertRaises(cls) as cm:
                lib.check(status)
            self.assertEqual(cm.exception.name, lib.status_string(status))
            self.assertEqual(cm.exception.status, status)
        with self.assertRaises(sdpa.SdpaError) as cm:
            lib.check(99)
        self.assertIs(type(cm.exception), sdpa.SdpaError)
        self.assertEqual(cm.exception.name, "SDPA_ERR_UNKNOWN")

    def test_status_names_match_the_library(self):
        lib = _lib.get()
        for code, name in sdpa.STATUS_NAMES.items():
            self.assertEqual(lib.status_string(code), name)

    def test_message_is_read_on_the_failing_call(self):
        """The message belongs to the call that failed, not to an earlier one."""
        with self.assertRaises(sdpa.SdpaError) as first:
            call(scale=-1.0)
        call()
        with self.assertRaises(sdpa.SdpaError) as second:
            call(attn_mask=np.ones((4, 5), bool))
        self.assertIn("scale", first.exception.message)
        self.assertNotIn("scale", second.exception.message)

    def test_messages_per_thread(self):
        """The detail message is thread-local in C and read right after the call, on the same
        thread: concurrent failing and succeeding calls (ctypes releases the GIL) each see their
        own message."""
        problems = []

        def worker(n):
            try:
                for r in range(200):
                    if r % 2:
                        call()
                        continue
                    try:
                        call(scale=-float(n + 1))
                    except sdpa.SdpaArgumentError as e:
                        if f"options->scale=-{n + 1}" not in e.message:
                            problems.append((n, e.message))
                    else:
                        problems.append((n, "no error"))
            except Exception as e:  # noqa: BLE001 - reported below
                problems.append((n, repr(e)))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(problems, [])

    def test_failed_call_leaves_out_untouched(self):
        out = np.full((1, 2, 3, 2), 7.0, np.float32)
        with self.assertRaises(sdpa.SdpaValueError):
            call(attn_mask=np.zeros((3, 5), bool), out=out)
        self.assertTrue(np.all(out == 7.0))

    def test_pickle(self):
        e = _errors.make_error(21, "msg")
        e2 = pickle.loads(pickle.dumps(e))
        self.assertIs(type(e2), sdpa.SdpaShapeError)
        self.assertEqual((e2.status, e2.name, e2.message), (21, "SDPA_ERR_SHAPE", "msg"))


class ScalarArgumentTest(unittest.TestCase):
    """Regressions: a string dropout_p was parsed, and out-of-range lengths warned."""

    def test_dropout_p_must_be_a_real_number(self):
        for bad in ("0.5", b"0.5", True, np.bool_(False), None, [0.5], np.array([0.5]), 0.5j):
            with self.subTest(bad=bad), self.assertRaises(sdpa.SdpaDtypeError) as cm:
                call(dropout_p=bad)
            self.assertIsInstance(cm.exception, TypeError)
            self.assertIn("dropout_p", cm.exception.message)
            self.assertIn("real number", cm.exception.message)
        plain = call()
        for ok in (0, 0.0, np.float32(0.0), np.float64(0.0), np.int64(0), np.array(0.0)):
            with self.subTest(ok=ok):
                np.testing.assert_array_equal(call(dropout_p=ok), plain)
        np.testing.assert_array_equal(call(dropout_p=np.float32(0.5), seed=3),
                                      call(dropout_p=0.5, seed=3))
        for other in ("scale", "softcap"):
            with self.subTest(other=other), self.assertRaises(sdpa.SdpaDtypeError):
                call(**{other: "2"})
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.allow_from_additive(np.zeros(3, np.float32), threshold="-1e4")

    def test_integer_options_reject_fractions(self):
        for kw in ({"seed": 1.5}, {"dropout_offset": 2.5}, {"num_threads": 1.5},
                   {"window": (1.5, 0)}, {"window": (0, "1")}):
            with self.subTest(**kw), self.assertRaises(sdpa.SdpaDtypeError) as cm:
                call(**kw)
            self.assertIn("integer", cm.exception.message)
        np.testing.assert_array_equal(call(window=(np.int64(1), np.int32(0)), seed=np.uint64(2)),
                                      call(window=(1, 0), seed=2))

    def test_out_of_range_lengths_raise_without_warning(self):
        for bad in ([2 ** 63], [2 ** 64], [-2 ** 63 - 1],
                    np.array([2 ** 63], np.uint64), np.array([2 ** 64 - 1], np.uint64)):
            for name in ("key_lengths", "query_lengths"):
                with self.subTest(bad=bad, name=name):
                    with warnings.catch_warnings():
                        warnings.simplefilter("error")   # a numpy cast warning fails here
                        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
                            call(**{name: bad})
                    self.assertEqual(cm.exception.name, "SDPA_ERR_INVALID_ARGUMENT")
                    self.assertIn("does not fit in int64", cm.exception.message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with self.assertRaises(sdpa.SdpaArgumentError):
                sdpa.padding_allow_mask([2 ** 64], 4)
            # floats, even integral or huge ones, and bools are not integers (one rule with
            # the block tables' int32_table and integer() for scalars)
            for bad in ([float("inf")], [1e300], [2.0 ** 63], [-1e19], [3.0], [True]):
                with self.subTest(bad=bad), self.assertRaises(sdpa.SdpaDtypeError):
                    call(key_lengths=bad)
            with self.assertRaises(sdpa.SdpaDtypeError):
                sdpa.padding_allow_mask([1e300], 4)
            with self.assertRaises(sdpa.SdpaShapeError):
                call(key_lengths=[2 ** 64, 1])
            # in range: int64 extremes reach the library, which names the bad length
            with self.assertRaises(sdpa.SdpaArgumentError) as cm:
                call(key_lengths=[2 ** 63 - 1])
            self.assertIn("key_lengths", cm.exception.message)
            np.testing.assert_array_equal(call(key_lengths=np.array([5], np.uint64)),
                                          call(key_lengths=[5]))


class LoadingTest(unittest.TestCase):
    def test_loaded_from_environment(self):
        lib = sdpa.library()
        if os.environ.get("SDPA_LIBRARY"):
            self.assertEqual(lib.path, os.environ["SDPA_LIBRARY"])
            self.assertEqual(lib.origin, "SDPA_LIBRARY")
        self.assertEqual(lib.version[:2], sdpa.EXPECTED_VERSION[:2])
        self.assertEqual(sdpa.library_version(), lib.version_string)
        self.assertIn(lib.version_string, repr(lib))

    def test_version_mismatch_message(self):
        """Simulated by changing the version the package expects."""
        path = sdpa.library().path
        found = sdpa.library().version_string
        saved = _lib.EXPECTED_VERSION
        try:
            for expected in ((0, 99, 0), (1, 0, 0)):
                _lib.EXPECTED_VERSION = expected
                with self.assertRaises(sdpa.SdpaVersionError) as cm:
                    _lib.load(path, "test")
                msg = str(cm.exception)
                self.assertIn(f"found {found}", msg)
                self.assertIn(path, msg)
                self.assertIn("written for " + ".".join(map(str, expected)), msg)
                self.assertIn(f"minor >= {expected[1]}", msg)
                self.assertIsInstance(cm.exception, ImportError)
        finally:
            _lib.EXPECTED_VERSION = saved
        self.assertIsNotNone(_lib.load(path, "test"))
        self.assertTrue(_lib.version_compatible((0, 3, 1), (0, 2, 0)))
        self.assertFalse(_lib.version_compatible((0, 1, 9), (0, 2, 0)))
        self.assertFalse(_lib.version_compatible((1, 2, 0), (0, 2, 0)))
        self.assertEqual(_lib.version_tuple(2003004), (2, 3, 4))

    def test_missing_library(self):
        with self.assertRaises(sdpa.SdpaLibraryError) as cm:
            _lib.load("/nonexistent/libsdpa.so", "test")
        self.assertIn("/nonexistent/libsdpa.so", str(cm.exception))
        self.assertIn("SDPA_LIBRARY", str(cm.exception))

    def test_load_hint_names_what_was_consulted(self):
        # SDPA_LIBRARY set: only it was tried; the fix is to correct or unset it.
        with self.assertRaises(sdpa.SdpaLibraryError) as cm:
            _lib.load("/nonexistent/libsdpa.so", "SDPA_LIBRARY")
        msg = str(cm.exception)
        self.assertIn("unset it", msg)
        self.assertNotIn("bundled libsdpa.so)", msg)
        self.assertNotIn("meson setup build", msg)
        with self.assertRaises(sdpa.SdpaLibraryError) as cm:
            _lib.load("libsdpa-nonexistent.so.0", "system loader")
        self.assertIn("Looked in: SDPA_LIBRARY (unset)", str(cm.exception))

    def test_build_tree_only_inside_a_checkout(self):
        # A copy of the package next to an application must not load <parent>/build*/libsdpa.so.
        root = tempfile.mkdtemp()
        try:
            for d in ("app/sdpa", "build-unrelated", "co/python/sdpa", "co/include", "co/build"):
                os.makedirs(os.path.join(root, d))
            open(os.path.join(root, "build-unrelated", "libsdpa.so"), "w").close()
            self.assertIsNone(_lib.repository_root(os.path.join(root, "app", "sdpa")))
            self.assertIsNone(_lib.repository_root(os.path.join(root, "co", "python", "sdpa")))
            for f in ("co/meson.build", "co/include/sdpa.h", "co/build/libsdpa.so"):
                open(os.path.join(root, f), "w").close()
            self.assertEqual(_lib.repository_root(os.path.join(root, "co", "python", "sdpa")),
                             os.path.join(root, "co"))
            # the package of this test's checkout is in one; an installed package (CI's wheel
            # job runs these tests against one) is not
            here = os.path.dirname(os.path.abspath(_lib.__file__))
            checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if here == os.path.join(checkout, "python", "sdpa"):
                self.assertEqual(_lib.repository_root(here), checkout)
            else:
                self.assertIsNone(_lib.repository_root(here), here)
        finally:
            shutil.rmtree(root)

    def test_build_tree_candidates(self):
        root = tempfile.mkdtemp()
        try:
            def lib(d, version, age):
                os.makedirs(os.path.join(root, d), exist_ok=True)
                real = os.path.join(root, d, f"libsdpa.so.{version}")
                open(real, "w").close()
                t = time.time() - age
                os.utime(real, (t, t))
                os.symlink(os.path.basename(real), os.path.join(root, d, "libsdpa.so"))
            lib("build", "0.1.0", 0)           # stale, although in build/
            lib("build-new", "0.2.0", 100)
            lib("build-newer", "0.3.1", 10)
            lib("build-old-major", "1.0.0", 0)
            os.makedirs(os.path.join(root, "build", "libsdpa.so.0.1.0.p"))
            got = [os.path.relpath(p, root) for p in _lib.build_tree_candidates(root, (0, 2, 0))]
            self.assertEqual(got[:2], ["build-newer/libsdpa.so", "build-new/libsdpa.so"])
            self.assertEqual(sorted(got[2:]), ["build-old-major/libsdpa.so", "build/libsdpa.so"])
            self.assertEqual(len(got), 4)
        finally:
            shutil.rmtree(root)


class MirrorTest(unittest.TestCase):
    def test_struct_sizes(self):
        if ctypes.sizeof(ctypes.c_void_p) == 8:
            for struct, size in _lib.STRUCT_SIZES_LP64.items():
                self.assertEqual(ctypes.sizeof(struct), size, struct.__name__)

    def check_defaults(self, struct, init, special):
        """Fill with 0xAB, let the library write its defaults for exactly our struct_size:
        every field must then be 0 (or its documented default): a field at the wrong offset
        shows."""
        s = struct()
        ctypes.memset(ctypes.byref(s), 0xAB, ctypes.sizeof(s))
        init(s, ctypes.sizeof(s))
        for name, _ in struct._fields_:
            value = getattr(s, name)
            want = special.get(name, 0)
            if name == "struct_size":
                want = ctypes.sizeof(struct)
            if want == 0 and value is None:
                value = 0
            self.assertEqual(value, want, f"{struct.__name__}.{name}")

    def test_options_defaults(self):
        lib = _lib.get()
        self.check_defaults(_lib.SdpaOptions, lib.sdpa_options_init_sized,
                            {"window_left": -1, "window_right": -1})

    def test_mha_defaults(self):
        lib = _lib.get()
        self.check_defaults(_lib.SdpaMhaParams, lib.sdpa_mha_params_init_sized, {})
        self.check_defaults(_lib.SdpaMhaOptions, lib.sdpa_mha_options_init_sized, {})

    def test_every_declared_function_is_exported(self):
        lib = _lib.get()
        for name in _lib.SIGNATURES:
            fn = getattr(lib, name)   # SdpaLibraryError if the library lacks it
            self.assertIsNotNone(fn.argtypes)


if __name__ == "__main__":
    unittest.main()
