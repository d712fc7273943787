"""The GPU worker: turns a delivered message into micro-batches, runs them, stores their
outcomes, acks messages — pipelined, so the model is not left waiting for the queue.

Called by the thin `inference.run_job` task with the job ids of one message
(`runner.BatchRunner`). The seed jobs open the first BatchWindow; the loop fills it from the
service's tier queues (realtime first, then weighted share) until it closes, claims the jobs
atomically in Postgres, and hands the batch to the model. While that forward pass runs (in a
thread: torch releases the GIL), the loop's thread forms and claims the next batch and the
store thread writes the previous one's outcomes; the forward passes themselves run one after
another. The loop goes on while work is waiting, for at most DRAIN_LIMIT_S, then the task
returns and Celery acks the seed.

Preemption happens between forward passes: before starting a batch of non-realtime work that
was formed during the previous pass, the loop looks for realtime work and runs it first. A
realtime job therefore waits for at most the batch already running, whose length the cost
model and the preemption budget bound (inference.scheduling.cost_model). A non-realtime
generation (an engine that is `resumable`: the LLM) longer than the budget runs in chunks of
decode steps: a pass that leaves it unfinished puts it back, still claimed and its message
unacked, at the front of the line, and a later pass continues it; only its final outcome is
stored.

A message is acked only once every job it carries has its outcome stored; on any error the
unacked messages go back to their queues, and their jobs' claims are taken over on redelivery.

One module per role:

- `runner`: BatchRunner, the task's entry: claims the seed, loads the engine, runs the loop;
- `loop`: DrainLoop, what runs next (realtime first, chunked generations carried on);
- `generation_loop`: GenerationLoop, for an LLM engine with continuous batching: jobs fed
  one by one into its decode loop and stored as each finishes (no passes, no chunks);
- `former`: BatchFormer, the batch window's contents, each job sized for the cost model;
- `intake`: pulling messages from the tier queues and claiming their jobs;
- `line`: the claimed jobs waiting to run, and whose tier's turn comes next;
- `model_thread`: the forward pass, on the model's thread;
- `store_thread`: writing outcomes (inference.dispatch.settlement), then acking;
- `ledger`: the pulled messages, acked when their jobs are stored or handed back;
- `held`, `report`: a claimed job as the worker holds it; what a run did.
"""
