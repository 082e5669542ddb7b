"""Measuring: a real training step's peak on this device, in a fresh process, and what held it."""
