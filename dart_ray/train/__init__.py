"""Training: the forward pass over packed step samples, the learner, the Ray Train worker loop
(FSDP2), and weight publication back to the policy servers.

- `forward`, `learner`, `fsdp`: the passes, the loss's optimizer steps, the sharding;
- `job`: what a worker is handed; `worker`: its loop;
- `publisher`: rank 0's publication, durable saves and acknowledgements; `leases`: the leases
  of trained-but-not-yet-durable rows; `checkpointing`, `resume`: durable state and where a
  trainer starts.
"""
