"""Makes the project importable under plain ``pytest`` too (``python -m pytest`` adds it anyway).

pytest puts the directory of a rootdir ``conftest.py`` on ``sys.path``, so ``import
char_gpt`` works from the tests without installing the project.
"""
