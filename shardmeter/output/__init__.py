"""Presentation of the model's results: number formatting and tables, the plan's text and JSON
reports, plots, Chrome traces. It imports the model; the model (``spec``, ``cost``, ``sim``,
``plan``) never imports it or the CLI (``tests/test_layers.py`` holds that contract)."""
