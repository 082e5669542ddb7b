"""Doctor: the preflight of a machine before training on it."""
