/* kvstore._chunk_keys.KeyIndex: chunk key (bytes) -> object, a dict's interface in about 30-38 bytes a key.

   KeyIndex(int_values=True) holds 64-bit signed integers unboxed in the value's place (an int object is made
   when one is read out): a memory tier's slot, its offset and metadata id packed in one integer, costs no object.

   The store's index (kvstore/store/index.py) maps every chunk it holds to its Entry, millions of them, and
   evicts and adds all day. A dict that keys come and go through never reuses a deleted entry's room: it
   appends until full, then rebuilds itself with room for three times its keys, so at steady state it holds
   60-120 bytes a key. This table reuses freed entries and deletes without tombstones:

       index    int32 buckets, entry + 1 (0: empty), linear probing from hash & mask, at most 3/4 full;
                a removal shifts the rest of its probe run back, so no bucket is ever a tombstone
       entries  {hash, key, value} (24 bytes); a freed one is chained from `free` (its hash holds the next);
                grown by an eighth at a time, and compacted when three quarters of it are free

   Keys are bytes (exact type), compared by length and memcmp: a lookup runs no Python code, so it is atomic
   under the GIL and the index's lock-free `holds(key)` stays safe. Another key type is absent on a lookup and
   a TypeError on a store. Iteration (keys, values, items, iter) returns a snapshot list. The Python twin is a
   plain dict (kvstore/store/index.py takes one when this build is absent); tests/kvstore/test_key_index.py
   holds both to the same answers.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MIN_BUCKETS 8
#define GROW_MIN 64

typedef union {
    PyObject *obj; /* a reference the table holds */
    long long num; /* an int_values table: the value itself, no object */
} Value;

typedef struct {
    Py_hash_t hash; /* the key's hash; a free entry: the next free entry (-1: none) */
    PyObject *key;  /* NULL: free */
    Value value;
} Slot;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count; /* live entries */
    Py_ssize_t used;  /* entries handed out so far: [0, used) are live or free */
    Py_ssize_t size;  /* entries allocated */
    Py_ssize_t free;  /* first free entry below `used`, -1: none */
    Slot *slots;
    int32_t *index;
    Py_ssize_t mask; /* buckets - 1 */
    int int_values;  /* values are machine integers (64-bit signed), held unboxed */
} KeyIndex;

/* The value of `slot` as a new reference (an int object made on the way out for an int_values table). */
static PyObject *value_of(KeyIndex *self, Slot *slot) {
    return self->int_values ? PyLong_FromLongLong(slot->value.num) : Py_NewRef(slot->value.obj);
}

/* `value` as the table holds it; -1 with an error set when an int_values table is given a non-int. */
static int value_in(KeyIndex *self, PyObject *value, Value *out) {
    if (!self->int_values) {
        out->obj = Py_NewRef(value);
        return 0;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "this KeyIndex holds int values, not %.80s", Py_TYPE(value)->tp_name);
        return -1;
    }
    long long num = PyLong_AsLongLong(value);
    if (num == -1 && PyErr_Occurred())
        return -1;
    out->num = num;
    return 0;
}

/* Drop the table's reference to a value taken out of it (nothing for an int_values table). */
static void value_drop(KeyIndex *self, Value value) {
    if (!self->int_values)
        Py_XDECREF(value.obj);
}

/* Put every live entry into a fresh, zeroed `index` of `buckets` buckets, which replaces the old one. */
static void rehash_into(KeyIndex *self, int32_t *index, Py_ssize_t buckets) {
    PyMem_Free(self->index);
    self->index = index;
    self->mask = buckets - 1;
    for (Py_ssize_t e = 0; e < self->used; e++) {
        if (self->slots[e].key == NULL)
            continue;
        Py_ssize_t b = (Py_ssize_t)((size_t)self->slots[e].hash & (size_t)self->mask);
        while (index[b])
            b = (b + 1) & self->mask;
        index[b] = (int32_t)(e + 1);
    }
}

/* A zeroed index of `buckets` buckets, or NULL with MemoryError set. */
static int32_t *new_index(Py_ssize_t buckets) {
    int32_t *index = PyMem_Calloc((size_t)buckets, sizeof(int32_t));
    if (index == NULL)
        PyErr_NoMemory();
    return index;
}

static Py_ssize_t buckets_for(Py_ssize_t count) {
    Py_ssize_t buckets = MIN_BUCKETS;
    while (4 * count > 3 * buckets)
        buckets *= 2;
    return buckets;
}

/* The bucket holding `key` (hash h), or -1. */
static Py_ssize_t find(KeyIndex *self, PyObject *key, Py_hash_t h) {
    const char *data = PyBytes_AS_STRING(key);
    Py_ssize_t len = PyBytes_GET_SIZE(key);
    Py_ssize_t b = (Py_ssize_t)((size_t)h & (size_t)self->mask);
    for (;;) {
        int32_t e = self->index[b];
        if (!e)
            return -1;
        Slot *slot = &self->slots[e - 1];
        if (slot->hash == h && (slot->key == key || (PyBytes_GET_SIZE(slot->key) == len &&
                                                       memcmp(PyBytes_AS_STRING(slot->key), data, (size_t)len) == 0)))
            return b;
        b = (b + 1) & self->mask;
    }
}

/* -1 with no error set: absent (or not bytes); -1 with an error: hashing failed. */
static Py_ssize_t lookup(KeyIndex *self, PyObject *key) {
    if (!PyBytes_CheckExact(key))
        return -1;
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1)
        return -1;
    return find(self, key, h);
}

static void drop_bucket(KeyIndex *self, Py_ssize_t i) {
    int32_t *index = self->index;
    Py_ssize_t mask = self->mask, j = i;
    for (;;) {
        j = (j + 1) & mask;
        int32_t e = index[j];
        if (!e)
            break;
        Py_ssize_t k = (Py_ssize_t)((size_t)self->slots[e - 1].hash & (size_t)mask);
        /* the entry at j may move to i unless its home lies cyclically in (i, j] */
        if ((i <= j) ? (k <= i || k > j) : (k <= i && k > j)) {
            index[i] = e;
            i = j;
        }
    }
    index[i] = 0;
}

/* Live entries to the front, then the index rebuilt: after many removals, so freed room goes back. Nothing
   changes when the new index cannot be allocated. */
static int compact(KeyIndex *self) {
    Py_ssize_t buckets = buckets_for(self->count);
    int32_t *index = new_index(buckets);
    if (index == NULL)
        return -1;
    Py_ssize_t to = 0;
    for (Py_ssize_t e = 0; e < self->used; e++) {
        if (self->slots[e].key != NULL)
            self->slots[to++] = self->slots[e];
    }
    self->used = to;
    self->free = -1;
    Py_ssize_t size = to ? to + (to >> 3) + GROW_MIN : 0;
    if (size == 0) { /* emptied: every block goes back */
        PyMem_Free(self->slots);
        self->slots = NULL;
        self->size = 0;
    } else {
        Slot *slots = PyMem_Realloc(self->slots, (size_t)size * sizeof(Slot));
        if (slots != NULL) { /* a failed shrink keeps the larger block */
            self->slots = slots;
            self->size = size;
        }
    }
    rehash_into(self, index, buckets);
    return 0;
}

static int grow_slots(KeyIndex *self) {
    Py_ssize_t size = self->size + (self->size >> 3 > GROW_MIN ? self->size >> 3 : GROW_MIN);
    if (size >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "KeyIndex holds at most 2**31 - 1 keys");
        return -1;
    }
    Slot *slots = PyMem_Realloc(self->slots, (size_t)size * sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->slots = slots;
    self->size = size;
    return 0;
}

static int store(KeyIndex *self, PyObject *key, PyObject *value) {
    if (!PyBytes_CheckExact(key)) {
        PyErr_Format(PyExc_TypeError, "KeyIndex keys are bytes, not %.80s", Py_TYPE(key)->tp_name);
        return -1;
    }
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1)
        return -1;
    Value held;
    if (value_in(self, value, &held) < 0)
        return -1;
    Py_ssize_t b = find(self, key, h);
    if (b >= 0) {
        Slot *slot = &self->slots[self->index[b] - 1];
        Value old = slot->value;
        slot->value = held;
        value_drop(self, old); /* last: a finalizer it runs sees a consistent table */
        return 0;
    }
    if (4 * (self->count + 1) > 3 * (self->mask + 1)) { /* the index first: on failure nothing has changed */
        Py_ssize_t buckets = 2 * (self->mask + 1);
        int32_t *index = new_index(buckets);
        if (index == NULL) {
            value_drop(self, held);
            return -1;
        }
        rehash_into(self, index, buckets);
    }
    Py_ssize_t e = self->free;
    if (e >= 0) {
        self->free = (Py_ssize_t)self->slots[e].hash;
    } else {
        if (self->used == self->size && grow_slots(self) < 0) {
            value_drop(self, held);
            return -1;
        }
        e = self->used++;
    }
    Slot *slot = &self->slots[e];
    slot->hash = h;
    Py_INCREF(key);
    slot->key = key;
    slot->value = held;
    self->count++;
    b = (Py_ssize_t)((size_t)h & (size_t)self->mask);
    while (self->index[b])
        b = (b + 1) & self->mask;
    self->index[b] = (int32_t)(e + 1);
    return 0;
}

/* Remove the entry at bucket b; returns its value (a new reference to the caller), or NULL with an error set
   and nothing removed when an int_values table has no memory for the int object. */
static PyObject *take(KeyIndex *self, Py_ssize_t b) {
    Py_ssize_t e = self->index[b] - 1;
    Slot *slot = &self->slots[e];
    PyObject *key = slot->key, *value = self->int_values ? PyLong_FromLongLong(slot->value.num) : slot->value.obj;
    if (value == NULL)
        return NULL;
    drop_bucket(self, b);
    slot->key = NULL;
    slot->value.obj = NULL;
    slot->hash = (Py_hash_t)self->free;
    self->free = e;
    self->count--;
    if (((self->used > 1024 && 4 * self->count < self->used) || self->count == 0) && compact(self) < 0)
        PyErr_Clear(); /* no memory for a smaller index: the table stays as it was, correct */
    Py_DECREF(key);
    return value;
}

static void clear_all(KeyIndex *self) {
    Slot *slots = self->slots;
    Py_ssize_t used = self->used;
    self->slots = NULL;
    self->used = self->size = self->count = 0;
    self->free = -1;
    if (self->index != NULL)
        memset(self->index, 0, (size_t)(self->mask + 1) * sizeof(int32_t));
    for (Py_ssize_t e = 0; e < used; e++) {
        if (slots[e].key != NULL)
            value_drop(self, slots[e].value);
        Py_XDECREF(slots[e].key);
    }
    PyMem_Free(slots);
}

/* ---- the Python type ------------------------------------------------------------------------------ */

static PyObject *KeyIndex_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"int_values", NULL};
    int int_values = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p:KeyIndex", kwlist, &int_values))
        return NULL;
    KeyIndex *self = (KeyIndex *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->int_values = int_values;
    self->free = -1;
    self->index = PyMem_Calloc(MIN_BUCKETS, sizeof(int32_t));
    if (self->index == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->mask = MIN_BUCKETS - 1;
    return (PyObject *)self;
}

static int KeyIndex_traverse(KeyIndex *self, visitproc visit, void *arg) {
    if (self->int_values)
        return 0;
    for (Py_ssize_t e = 0; e < self->used; e++) {
        Py_VISIT(self->slots[e].value.obj);
    }
    return 0;
}

static int KeyIndex_clear(KeyIndex *self) {
    clear_all(self);
    return 0;
}

static void KeyIndex_dealloc(KeyIndex *self) {
    PyObject_GC_UnTrack(self);
    clear_all(self);
    PyMem_Free(self->index);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t KeyIndex_len(KeyIndex *self) { return self->count; }

static int KeyIndex_contains(KeyIndex *self, PyObject *key) {
    Py_ssize_t b = lookup(self, key);
    return b >= 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
}

static PyObject *KeyIndex_subscript(KeyIndex *self, PyObject *key) {
    Py_ssize_t b = lookup(self, key);
    if (b < 0) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return value_of(self, &self->slots[self->index[b] - 1]);
}

static int KeyIndex_ass_subscript(KeyIndex *self, PyObject *key, PyObject *value) {
    if (value != NULL)
        return store(self, key, value);
    Py_ssize_t b = lookup(self, key);
    if (b < 0) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    PyObject *old = take(self, b);
    if (old == NULL)
        return -1;
    Py_DECREF(old);
    return 0;
}

static PyObject *KeyIndex_get(KeyIndex *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t b = lookup(self, args[0]);
    if (b >= 0)
        return value_of(self, &self->slots[self->index[b] - 1]);
    if (PyErr_Occurred())
        return NULL;
    return Py_NewRef(nargs == 2 ? args[1] : Py_None);
}

static PyObject *KeyIndex_pop(KeyIndex *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    Py_ssize_t b = lookup(self, args[0]);
    if (b >= 0)
        return take(self, b);
    if (PyErr_Occurred())
        return NULL;
    if (nargs == 2)
        return Py_NewRef(args[1]);
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

/* A list of the keys (what 0), values (1) or (key, value) tuples (2). */
static PyObject *snapshot(KeyIndex *self, int what) {
    PyObject *out = PyList_New(self->count);
    if (out == NULL)
        return NULL;
    Py_ssize_t n = 0;
    for (Py_ssize_t e = 0; e < self->used && n < self->count; e++) {
        Slot *slot = &self->slots[e];
        if (slot->key == NULL)
            continue;
        PyObject *item;
        if (what == 0) {
            item = Py_NewRef(slot->key);
        } else {
            PyObject *value = value_of(self, slot);
            if (value == NULL || what == 1) {
                item = value;
            } else {
                item = PyTuple_Pack(2, slot->key, value);
                Py_DECREF(value);
            }
        }
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n++, item);
    }
    return out;
}

static PyObject *KeyIndex_keys(KeyIndex *self, PyObject *unused) { return snapshot(self, 0); }
static PyObject *KeyIndex_values(KeyIndex *self, PyObject *unused) { return snapshot(self, 1); }
static PyObject *KeyIndex_items(KeyIndex *self, PyObject *unused) { return snapshot(self, 2); }

static PyObject *KeyIndex_iter(KeyIndex *self) {
    PyObject *keys = snapshot(self, 0);
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *KeyIndex_clear_method(KeyIndex *self, PyObject *unused) {
    clear_all(self);
    Py_RETURN_NONE;
}

static PyObject *KeyIndex_nbytes(KeyIndex *self, PyObject *unused) {
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(KeyIndex) + self->size * (Py_ssize_t)sizeof(Slot) +
                              (self->mask + 1) * (Py_ssize_t)sizeof(int32_t));
}

static PyMethodDef KeyIndex_methods[] = {
    {"get", (PyCFunction)(void (*)(void))KeyIndex_get, METH_FASTCALL, "get(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))KeyIndex_pop, METH_FASTCALL, "pop(key[, default])"},
    {"keys", (PyCFunction)KeyIndex_keys, METH_NOARGS, "A list of the keys."},
    {"values", (PyCFunction)KeyIndex_values, METH_NOARGS, "A list of the values."},
    {"items", (PyCFunction)KeyIndex_items, METH_NOARGS, "A list of (key, value) pairs."},
    {"clear", (PyCFunction)KeyIndex_clear_method, METH_NOARGS, "Remove every key."},
    {"nbytes", (PyCFunction)KeyIndex_nbytes, METH_NOARGS, "Bytes the table allocates (keys and values not counted)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods KeyIndex_as_sequence = {.sq_contains = (objobjproc)KeyIndex_contains};

static PyMappingMethods KeyIndex_as_mapping = {
    .mp_length = (lenfunc)KeyIndex_len,
    .mp_subscript = (binaryfunc)KeyIndex_subscript,
    .mp_ass_subscript = (objobjargproc)KeyIndex_ass_subscript,
};

static PyTypeObject KeyIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._chunk_keys.KeyIndex",
    .tp_basicsize = sizeof(KeyIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "KeyIndex(*, int_values=False): chunk key (bytes) -> object (or unboxed int), compact under churn; a "
              "dict's interface (see key_index.c).",
    .tp_new = KeyIndex_new,
    .tp_dealloc = (destructor)KeyIndex_dealloc,
    .tp_traverse = (traverseproc)KeyIndex_traverse,
    .tp_clear = (inquiry)KeyIndex_clear,
    .tp_iter = (getiterfunc)KeyIndex_iter,
    .tp_methods = KeyIndex_methods,
    .tp_as_sequence = &KeyIndex_as_sequence,
    .tp_as_mapping = &KeyIndex_as_mapping,
};

int kvstore_add_key_index(PyObject *module) {
    if (PyType_Ready(&KeyIndexType) < 0)
        return -1;
    Py_INCREF(&KeyIndexType);
    if (PyModule_AddObject(module, "KeyIndex", (PyObject *)&KeyIndexType) < 0) {
        Py_DECREF(&KeyIndexType);
        return -1;
    }
    return 0;
}
