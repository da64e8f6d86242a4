"""heavylift's pyinfra operations and facts, one module per stage of the rollout."""
