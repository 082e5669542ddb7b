"""Budget: the memory one device gives training.

Named cards, the emulated card, the machine's devices, and what fits the budget.
"""
