"""Async sharded checkpointing (torch.distributed.checkpoint), atomic commit, exact resume,
preemption-safe requeue. See docs/checkpoint.md."""
