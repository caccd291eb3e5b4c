"""Helpers shared by the tests, imported as ``tests.helpers.<module>``.

One package instead of bare-name imports, so test files need no unique names and
a helper is found the same way from every folder.  Fixtures are re-exported by
the conftest.py of the folder that uses them.
"""
