"""One module per domain; ``definitions.py`` merges them."""
