/* kvstore._chunk_keys: the two loops of kvstore/hashing.py that dominate a first lookup, in C.

   pack_int32(list or tuple of int) -> bytearray of the ids as little-endian int32
   chain_keys(buffer, root_key, step_bytes) -> list of 16-byte keys, key[i] = xxh3_128(key[i-1] || chunk i)
   chain_ids(list or tuple of int, root_key, chunk_tokens, pending) -> (keys, tail): both in one pass over the
       list (no int32 copy of the whole prompt): `pending` (int32 bytes, fewer than chunk_tokens ids) goes first,
       each chunk's ids are packed into a chunk-sized scratch and hashed at once, `tail` is what is left over

   Both are twins of the pure-Python code in kvstore/hashing.py (tests/kvstore/test_native_keys.py holds
   them to identical output and identical rejections). pack_int32 raises OverflowError for an id outside
   [0, 2**31) and TypeError for an item that is not an int (the caller then takes the pure path, which
   names the problem). vendor/xxhash.h is xxHash 0.8.4 (BSD-2-Clause, vendor/LICENSE-xxhash), the version python-xxhash
   4.1.0 bundles; keys are its canonical (big-endian) 128-bit digests, byte for byte what
   xxhash.xxh3_128_digest returns. Built by `pip install` (setup.py), which defines KVSTORE_SOURCE_HASH, the
   hash of these sources: the module's SOURCE_HASH, checked against the installed sources by kvstore/native_keys.py.
   The module also carries KeyIndex (key_index.c, compiled with it), the store index's compact map.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "vendor/xxhash.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvstore._chunk_keys stores token ids in native order and needs a little-endian machine"
#endif

#ifndef KVSTORE_SOURCE_HASH
#define KVSTORE_SOURCE_HASH "unknown" /* built outside setup.py: never taken for a build of the sources */
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

/* The key of scratch[0:nbytes] (the previous key, then a chunk's ids) as a new bytes object; it also becomes the
   scratch's first KEY_BYTES, the previous key of the next chunk. NULL with an exception set. */
static PyObject *next_key(char *scratch, size_t nbytes) {
    XXH128_canonical_t digest;
    XXH128_canonicalFromHash(&digest, XXH3_128bits(scratch, nbytes));
    memcpy(scratch, digest.digest, KEY_BYTES);
    return PyBytes_FromStringAndSize((const char *)digest.digest, KEY_BYTES);
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
        PyObject *key = next_key(scratch, (size_t)(KEY_BYTES + step));
        if (key == NULL) {
            PyMem_Free(scratch);
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, i, key);
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

/* One pass over a list of ids: pack each chunk's ids into the scratch after the previous key, hash it when full.
   A first lookup of a 128k-token prompt thereby touches each int object once and writes 1 KiB of scratch, where
   pack_int32 + chain_keys wrote and re-read a 512 KiB array (and numpy checked it twice). */
static PyObject *chain_list(PyObject **items, Py_ssize_t n, const char *root, Py_ssize_t chunk, const char *pending,
                            Py_ssize_t pending_count) {
    PyObject *keys = PyList_New((pending_count + n) / chunk);
    char *scratch = keys == NULL ? NULL : PyMem_Malloc((size_t)(KEY_BYTES + chunk * (Py_ssize_t)sizeof(int32_t)));
    if (scratch == NULL) {
        Py_XDECREF(keys);
        return keys == NULL ? NULL : PyErr_NoMemory();
    }
    int32_t *values = (int32_t *)(scratch + KEY_BYTES);
    memcpy(scratch, root, KEY_BYTES);
    memcpy(values, pending, (size_t)pending_count * sizeof(int32_t));
    Py_ssize_t fill = pending_count, made = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (token_of(items[i], i, &values[fill]) < 0) {
            goto fail;
        }
        if (++fill == chunk) {
            PyObject *key = next_key(scratch, (size_t)(KEY_BYTES + chunk * (Py_ssize_t)sizeof(int32_t)));
            if (key == NULL) {
                goto fail;
            }
            PyList_SET_ITEM(keys, made++, key);
            fill = 0;
        }
    }
    PyObject *tail = PyBytes_FromStringAndSize((const char *)values, fill * (Py_ssize_t)sizeof(int32_t));
    PyObject *result = tail == NULL ? NULL : PyTuple_Pack(2, keys, tail);
    Py_XDECREF(tail);
    Py_DECREF(keys);
    PyMem_Free(scratch);
    return result;
fail:  /* the list's unset items are NULL, which its deallocation skips */
    Py_DECREF(keys);
    PyMem_Free(scratch);
    return NULL;
}

static PyObject *chain_ids(PyObject *self, PyObject *args) {
    PyObject *ids;
    Py_buffer root, pending;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "Oy*ny*:chain_ids", &ids, &root, &chunk, &pending)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (root.len != KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "chain_ids: the root key is %d bytes, got %zd", KEY_BYTES, root.len);
    } else if (chunk <= 0) {
        PyErr_Format(PyExc_ValueError, "chain_ids: chunk_tokens must be positive, got %zd", chunk);
    } else if (pending.len % (Py_ssize_t)sizeof(int32_t) != 0 || pending.len / 4 >= chunk) {
        PyErr_Format(PyExc_ValueError, "chain_ids: pending holds %zd bytes; it takes whole int32 ids, fewer than a chunk",
                     pending.len);
    } else {
        PyObject *seq = PySequence_Fast(ids, "chain_ids takes a list or tuple of token ids");
        if (seq != NULL) {
            result = chain_list(PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), (const char *)root.buf,
                                chunk, (const char *)pending.buf, pending.len / 4);
            Py_DECREF(seq);
        }
    }
    PyBuffer_Release(&root);
    PyBuffer_Release(&pending);
    return result;
}

static PyMethodDef methods[] = {
    {"pack_int32", pack_int32, METH_O, "A list or tuple of token ids as a bytearray of little-endian int32."},
    {"chain_keys", chain_keys, METH_VARARGS, "Chained xxh3_128 keys of every whole chunk of a buffer."},
    {"chain_ids", chain_ids, METH_VARARGS, "Chained keys of a list of ids after pending ids, and the ids left over."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvstore._chunk_keys",
                                    "Chunk keys in C (kvstore/hashing.py's twin).", -1, methods};

int kvstore_add_key_index(PyObject *module); /* key_index.c: the store index's compact map */

PyMODINIT_FUNC PyInit__chunk_keys(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddStringConstant(m, "SOURCE_HASH", KVSTORE_SOURCE_HASH) < 0 ||
                      kvstore_add_key_index(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
