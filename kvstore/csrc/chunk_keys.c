/* kvstore._chunk_keys: the two loops of kvstore/hashing.py that dominate a first lookup, in C.

   pack_int32(list or tuple of int) -> bytearray of the ids as little-endian int32
   chain_keys(buffer, root_key, step_bytes) -> list of 16-byte keys, key[i] = xxh3_128(key[i-1] || chunk i)

   Both are twins of the pure-Python code in kvstore/hashing.py (tests/kvstore/test_native_keys.py holds
   them to identical output and identical rejections). pack_int32 raises OverflowError for an id outside
   [0, 2**31) and TypeError for an item that is not an int (the caller then takes the pure path, which
   names the problem). xxhash.h is xxHash 0.8.4 (BSD-2-Clause, LICENSE-xxhash), the version python-xxhash
   4.1.0 bundles; keys are its canonical (big-endian) 128-bit digests, byte for byte what
   xxhash.xxh3_128_digest returns. Built by kvstore/native_keys.py (scripts/setup.sh).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvstore._chunk_keys stores token ids in native order and needs a little-endian machine"
#endif

#define KEY_BYTES 16

/* One id as int32, or -1 with an exception set (TypeError: not an int; OverflowError: out of range). */
static int token_of(PyObject *item, Py_ssize_t index, int32_t *out) {
    if (!PyLong_Check(item)) {
        PyErr_Format(PyExc_TypeError, "token ids must be integers in [0, 2**31): item %zd is a %.80s",
                     index, Py_TYPE(item)->tp_name);
        return -1;
    }
    long value;
    int overflow = 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {  /* one digit: no call, no checks */
        value = (long)PyUnstable_Long_CompactValue((PyLongObject *)item);
    } else {
        value = PyLong_AsLongAndOverflow(item, &overflow);
    }
#else
    Py_ssize_t size = Py_SIZE(item);
    if (size == 0 || size == 1) {  /* 0, or one 30-bit digit (every token id of a real vocabulary) */
        value = size == 0 ? 0 : (long)((PyLongObject *)item)->ob_digit[0];
    } else {
        value = PyLong_AsLongAndOverflow(item, &overflow);
    }
#endif
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0 || value < 0 || value > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "token ids must be integers in [0, 2**31): item %zd is %R", index, item);
        return -1;
    }
    *out = (int32_t)value;
    return 0;
}

static PyObject *pack_int32(PyObject *self, PyObject *ids) {
    PyObject *seq = PySequence_Fast(ids, "pack_int32 takes a list or tuple of token ids");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    int32_t *values = (int32_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (token_of(items[i], i, &values[i]) < 0) {
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return out;
}

/* Chained keys of every whole step_bytes chunk of data, from root (16 bytes). */
static PyObject *chain(const char *data, Py_ssize_t nbytes, const char *root, Py_ssize_t step) {
    Py_ssize_t count = nbytes / step;
    PyObject *keys = PyList_New(count);
    char *scratch = keys == NULL ? NULL : PyMem_Malloc((size_t)(KEY_BYTES + step));
    if (scratch == NULL) {
        Py_XDECREF(keys);
        return keys == NULL ? NULL : PyErr_NoMemory();
    }
    memcpy(scratch, root, KEY_BYTES);
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(scratch + KEY_BYTES, data + i * step, (size_t)step);
        XXH128_canonical_t digest;
        XXH128_canonicalFromHash(&digest, XXH3_128bits(scratch, (size_t)(KEY_BYTES + step)));
        PyObject *key = PyBytes_FromStringAndSize((const char *)digest.digest, KEY_BYTES);
        if (key == NULL) {
            PyMem_Free(scratch);
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, i, key);
        memcpy(scratch, digest.digest, KEY_BYTES);
    }
    PyMem_Free(scratch);
    return keys;
}

static PyObject *chain_keys(PyObject *self, PyObject *args) {
    Py_buffer data, root;
    Py_ssize_t step;
    if (!PyArg_ParseTuple(args, "y*y*n:chain_keys", &data, &root, &step)) {
        return NULL;
    }
    PyObject *keys = NULL;
    if (root.len != KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "chain_keys: the root key is %d bytes, got %zd", KEY_BYTES, root.len);
    } else if (step <= 0) {
        PyErr_Format(PyExc_ValueError, "chain_keys: step_bytes must be positive, got %zd", step);
    } else {
        keys = chain((const char *)data.buf, data.len, (const char *)root.buf, step);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&root);
    return keys;
}

static PyMethodDef methods[] = {
    {"pack_int32", pack_int32, METH_O, "A list or tuple of token ids as a bytearray of little-endian int32."},
    {"chain_keys", chain_keys, METH_VARARGS, "Chained xxh3_128 keys of every whole chunk of a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunk_keys", "Chunk keys in C (kvstore/hashing.py's twin).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__chunk_keys(void) { return PyModule_Create(&module); }
