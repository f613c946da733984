"""Training: the forward pass over packed step samples, the Ray Train worker loop (FSDP2),
and weight publication back to the policy servers."""
