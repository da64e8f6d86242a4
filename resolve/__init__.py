"""The control side: from a deployment, the host's facts and the run context to one plan. No SSH, no pyinfra operations."""
