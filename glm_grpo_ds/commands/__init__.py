"""The ``glm-grpo`` command line: the entry point (cli.py) and one module per tool. Nothing in the
training path imports from here."""
