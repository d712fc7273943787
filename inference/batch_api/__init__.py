"""OpenAI's Batch API on renq: uploaded JSONL files and batches whose lines run as offline-tier
renq jobs, yielding to realtime traffic on the same workers. Files and progress live in
Postgres, so a batch survives any process restart and resumes where it stopped.

Its own Django app (label `batch_api`), built on the OpenAI front door (inference.openai_api:
endpoints, errors, auth); renq_site.urls mounts its routes under /v1/ beside the front door's.
"""
