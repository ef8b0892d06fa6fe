"""The bottom layer: settings, the one error tree, broker discovery. Imports nothing of trajlake."""
