"""The OpenAI-compatible front door, mounted at /v1/: embeddings, rerank, chat and text
completions, models. The Batch API's files and batches (inference.batch_api) build on it.

Every request becomes an ordinary renq job through `inference.intake.submission.submit_job`
(validation, admission, routing, tiers); the view then waits for the job's outcome without
polling (`inference.delivery.waiting`) and answers in OpenAI's shape. The views are async and
served under ASGI by `FrontDoorHandler` (asgi.py): a waiting request holds a socket, not a thread.
"""
