"""Python stacks of allocations: capturing them cheaply, and whose code each frame is."""
