"""Console: what memfit shows on a terminal while long work runs from Python."""
