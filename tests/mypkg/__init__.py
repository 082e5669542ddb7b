"""`mypkg`: the user's package that the docstring examples name (`mypkg.models:build`)."""
