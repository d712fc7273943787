"""A job larger than one pass may hold runs in parts on the worker that claimed it: each
pass within the batch's token budget, the parts' results stored together in input order."""

from __future__ import annotations

import numpy as np
import pytest

from inference.engines import load_engine
from inference.models import Job, JobStatus
from inference.workers.gpu.runner import BatchRunner
from tests.inference.workers.test_chunked_generation import NoBroker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_job_over_the_token_budget_runs_in_parts_and_keeps_input_order(
    make_tenant, make_service
):
    service = make_service("embedding", name="embedding-big", max_total_tokens=600)
    tenant, _ = make_tenant()
    texts = [f"text {i} " + " ".join(f"word{i}x{j}" for j in range(40 + i % 5)) for i in range(24)]
    job = Job.objects.create(tenant=tenant, service=service, tier="batch", input={"texts": texts})

    report = BatchRunner(NoBroker()).run([str(job.pk)], seed_redelivered=False, seed_tier=None)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.error, report)
    engine = load_engine("embedding", service.model_ref, device="cpu")
    assert job.input_tokens == engine.count_tokens({"texts": texts}) > 3 * 600
    assert report["batches"] >= 4 and report["continued"] == report["batches"] - 1
    matrix = job.embedding_matrix()
    assert matrix.count == len(texts)
    alone = engine.run_batch([{"texts": texts}])[0]["embeddings"]
    got = np.frombuffer(bytes(job.result_vectors), dtype="<f4").reshape(len(texts), -1)
    assert np.allclose(got, alone, atol=1e-4)  # each text's own vector, in input order
