"""Cohere's embed through Cohere's own SDK: v2 `/v2/embed` (ClientV2) and v1 `/v1/embed`
(Client) give the vectors `/v1/embeddings` gives for the same texts, in Cohere's shapes; every
request one renq job run by the real GPU worker behind a real gunicorn."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TEXTS = ["a cat is an animal", "tax forms are due"]
# all-MiniLM-L6-v2, the test embedding service's model.
MODEL_DIM = 384


def openai_vectors(client, texts: list[str]) -> np.ndarray:
    answer = client.embeddings.create(model="embedding", input=texts, encoding_format="float")
    return np.array([item.embedding for item in answer.data])


def decoded(strings: list[str]) -> np.ndarray:
    """Cohere's base64: each vector's little-endian float32 bytes."""
    return np.array([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in strings])


@pytest.fixture
def cohere_v2(front_door_url, tenant_key, services):
    import cohere

    return cohere.ClientV2(api_key=tenant_key, base_url=front_door_url, timeout=60)


def test_cohere_v2_embed_floats_and_base64(gpu_worker, cohere_v2, client):
    answer = cohere_v2.embed(
        model="embedding",
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "base64"],
        truncate="END",
    )
    floats = np.array(answer.embeddings.float_)
    assert floats.shape == (len(TEXTS), MODEL_DIM)
    assert np.allclose(floats, openai_vectors(client, TEXTS), atol=1e-6)
    assert np.array_equal(decoded(answer.embeddings.base64), floats.astype("<f4"))
    assert answer.embeddings.int8 is None
    assert answer.texts == TEXTS
    assert answer.response_type == "embeddings_by_type"
    assert answer.meta.api_version.version == "2"
    assert answer.meta.billed_units.input_tokens > 0

    default = cohere_v2.embed(model="embedding", texts=TEXTS[:1], input_type="search_query")
    assert np.allclose(default.embeddings.float_, floats[:1], atol=1e-6)  # float by default
    assert default.embeddings.base64 is None


def test_cohere_v2_output_dimension_truncates_and_renormalises(gpu_worker, cohere_v2):
    import cohere

    full = cohere_v2.embed(model="embedding", texts=TEXTS[:1], input_type="clustering")
    short = cohere_v2.embed(
        model="embedding", texts=TEXTS[:1], input_type="clustering", output_dimension=64
    )
    vector = np.array(short.embeddings.float_[0])
    head = np.array(full.embeddings.float_[0][:64])
    assert vector.shape == (64,)
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)
    assert np.allclose(vector, head / np.linalg.norm(head), atol=1e-6)
    with pytest.raises(cohere.BadRequestError) as caught:
        cohere_v2.embed(
            model="embedding", texts=TEXTS[:1], input_type="clustering", output_dimension=4096
        )
    assert caught.value.body["error"]["param"] == "output_dimension"


def test_cohere_v1_client_floats_then_by_type(gpu_worker, front_door_url, tenant_key, client):
    import cohere

    v1 = cohere.Client(api_key=tenant_key, base_url=front_door_url, timeout=60)
    expected = openai_vectors(client, TEXTS)
    floats = v1.embed(model="embedding", texts=TEXTS, input_type="classification")
    assert floats.response_type == "embeddings_floats"
    assert np.array(floats.embeddings).shape == (len(TEXTS), MODEL_DIM)
    assert np.allclose(floats.embeddings, expected, atol=1e-6)
    assert floats.texts == TEXTS
    assert floats.meta.api_version.version == "1"
    assert floats.meta.billed_units.input_tokens > 0

    by_type = v1.embed(model="embedding", texts=TEXTS, embedding_types=["base64"])
    assert by_type.response_type == "embeddings_by_type"
    assert by_type.embeddings.float_ is None  # only what was asked for
    assert np.allclose(decoded(by_type.embeddings.base64), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("field", "request_fields"),
    [
        ("input_type", {"input_type": "image"}),
        ("images", {"input_type": "search_document", "images": ["data:image/png;base64,iVBO"]}),
        ("embedding_types", {"input_type": "search_document", "embedding_types": ["int8"]}),
        ("truncate", {"input_type": "search_document", "truncate": "START"}),
    ],
)
def test_cohere_v2_refusals_name_the_field(cohere_v2, field, request_fields):
    import cohere

    texts = None if field == "images" else TEXTS
    with pytest.raises(cohere.BadRequestError) as caught:
        cohere_v2.embed(model="embedding", texts=texts, **request_fields)
    error = caught.value.body["error"]
    assert caught.value.status_code == 400
    assert error["param"] == field
    assert error["message"].startswith(field) and error["message"] in str(caught.value)
