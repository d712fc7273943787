"""OpenAI's Batch API on renq: uploaded JSONL files and batches whose lines run as offline-tier
renq jobs, yielding to realtime traffic on the same workers. Files and progress live in
Postgres, so a batch survives any process restart and resumes where it stopped."""
