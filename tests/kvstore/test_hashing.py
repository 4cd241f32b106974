"""Chained chunk keys: prefix sharing, namespaces, stability across processes and input types."""

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from kvstore.errors import BadChunkError
from kvstore.hashing import ChunkHasher, Namespace, chunk_keys, validate_key

ROOT = Namespace(model_id="m", layout_fingerprint=1).root_key


def test_full_chunks_only() -> None:
    assert len(chunk_keys(list(range(1000)), ROOT, 256)) == 3  # the 232-token tail has no key
    assert chunk_keys(list(range(255)), ROOT, 256) == []


def test_shared_prefix_shares_keys_exactly() -> None:
    a = list(range(1024))
    b = a[:512] + [7] * 512
    ka, kb = chunk_keys(a, ROOT, 256), chunk_keys(b, ROOT, 256)
    assert ka[:2] == kb[:2] and ka[2] != kb[2] and ka[3] != kb[3]
    # a change in chunk 0 changes every later key (chaining)
    c = [9, *a[1:]]
    assert all(x != y for x, y in zip(chunk_keys(c, ROOT, 256), ka, strict=True))


def test_namespace_separates_tenants_models_layouts() -> None:
    tokens = list(range(512))
    roots = {Namespace(model_id="m", layout_fingerprint=1).root_key,
             Namespace(model_id="m", layout_fingerprint=1, tenant_salt="t2").root_key,
             Namespace(model_id="m2", layout_fingerprint=1).root_key,
             Namespace(model_id="m", layout_fingerprint=2).root_key}
    assert len(roots) == 4
    assert len({chunk_keys(tokens, r, 256)[0] for r in roots}) == 4


def test_input_types_agree() -> None:
    tokens = list(range(3000, 3512))
    expected = chunk_keys(tokens, ROOT, 256)
    assert chunk_keys(np.array(tokens, dtype=np.int64), ROOT, 256) == expected
    assert chunk_keys(torch.tensor(tokens, dtype=torch.int32), ROOT, 256) == expected
    assert chunk_keys(np.array(tokens, dtype=np.int32), ROOT, 256) == expected


def test_a_list_of_ids_gives_the_array_keys_on_either_conversion() -> None:
    """A list of ints takes the marshal path (one C loop); a list marshal cannot write as 4-byte ints
    (a value of 2**31 - 1 and repeats, a bool, a numpy scalar) takes array.array's or numpy's: same keys."""
    tokens = [2**31 - 1, 0, 7, 7, 7, 255, 256, 128_000] * 64
    expected = chunk_keys(np.array(tokens, dtype=np.int32), ROOT, 256)
    assert chunk_keys(tokens, ROOT, 256) == expected
    assert chunk_keys([np.int64(t) for t in tokens], ROOT, 256) == expected
    assert chunk_keys(tuple(tokens), ROOT, 256) == expected
    assert chunk_keys([True, *tokens[1:]], ROOT, 256) == chunk_keys([1, *tokens[1:]], ROOT, 256)


def test_stable_across_processes() -> None:
    code = ("from kvstore.hashing import Namespace, chunk_keys;"
            "print(chunk_keys(list(range(512)), Namespace(model_id='m', layout_fingerprint=1).root_key, 256)[1].hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert out == chunk_keys(list(range(512)), ROOT, 256)[1].hex()


def test_incremental_hasher_matches_batch() -> None:
    tokens = list(range(1100))
    hasher = ChunkHasher(ROOT, 256)
    new = []
    for start in range(0, len(tokens), 37):
        new += hasher.extend(tokens[start:start + 37])
    assert new == hasher.keys == chunk_keys(tokens, ROOT, 256)


@pytest.mark.parametrize("bad", [[1, -2, 3], [1.5, 2.0], [[1, 2], [3, 4]], [2**40], [1, 2**31], [3, "a"]])
def test_bad_token_ids(bad: Any) -> None:
    with pytest.raises(BadChunkError):
        chunk_keys(bad, ROOT, 1)


def test_validate_key() -> None:
    key = chunk_keys(list(range(256)), ROOT, 256)[0]
    assert validate_key(key.hex()) == key
    for bad in ["../../etc/passwd", "zz" * 16, b"short", 12]:
        with pytest.raises(BadChunkError):
            validate_key(bad)


def test_tail_key_names_the_tokens_after_the_whole_chunks_and_never_a_chain_key() -> None:
    def tail(tokens: list[int]) -> bytes | None:
        hasher = ChunkHasher(ROOT, 4)
        hasher.extend(tokens)
        return hasher.tail_key()

    assert tail([1, 2, 3, 4]) is None and tail([]) is None
    assert tail([1, 2, 3, 4, 5]) == tail([1, 2, 3, 4, 5]) != tail([1, 2, 3, 4, 6])
    assert tail([9, 2, 3, 4, 5]) != tail([1, 2, 3, 4, 5]), "the chunks before the tail are in its key"
    assert tail([1, 2, 3]) not in chunk_keys([1, 2, 3, 0], ROOT, 3) + chunk_keys([1, 2, 3], ROOT, 3)
    incremental = ChunkHasher(ROOT, 4)
    for token in [1, 2, 3, 4, 5, 6]:
        incremental.extend([token])
    assert incremental.tail_key() == tail([1, 2, 3, 4, 5, 6])
