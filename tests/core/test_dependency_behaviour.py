"""Where the lab leans on a library's behaviour that changed between releases of the range
pyproject.toml allows (CI runs tests/core on every runtime dependency's floor): no socket,
just the functions that depend on it."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from inference_lab.gateway.errors import GatewayError
from inference_lab.gateway.protocols.base import NOT_UTF8, decode
from inference_lab.gateway.protocols.pooling.vectors import embedding


class Body(msgspec.Struct):
    model: str


@pytest.mark.parametrize("body", [b'{"model": "\xe9pt"}', b'{"model": "m\xff"}'])
def test_a_string_that_is_not_utf8_is_an_invalid_request_on_every_msgspec(body):
    # older msgspec raises UnicodeDecodeError here, newer a DecodeError: both are a 400
    with pytest.raises(GatewayError) as info:
        decode(msgspec.json.Decoder(Body), body)
    assert info.value.message == NOT_UTF8 or info.value.message.startswith("Invalid JSON body")


def test_an_embedding_is_a_unit_float32_vector_on_every_numpy():
    # older numpy's bincount refuses unsigned 64-bit indices
    vector = embedding("bge-base-en-v1.5", 768, [1, 2, 3, 2**32 - 1])
    assert vector.dtype == np.float32 and vector.shape == (768,)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    again = embedding("bge-base-en-v1.5", 768, [1, 2, 3, 2**32 - 1])
    assert np.array_equal(vector, again)
