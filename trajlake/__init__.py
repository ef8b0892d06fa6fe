"""The application shell: the ``trajlake`` command line and the end-to-end demo."""
