"""Makes the project importable under plain ``pytest`` too (``python -m pytest`` adds it anyway).

pytest puts the directory of a rootdir ``conftest.py`` on ``sys.path``, so ``import
digits_loop`` works from the tests without installing the project.
"""
