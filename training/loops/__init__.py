"""The training loop, shared by PyTorch and TensorFlow, and what a run keeps around it (plan, preemption, run files)."""
